"""The usage buffer (metering/usage.py): batches in order, retries, in-flight records, its bound."""

from metering.usage import UsageBuffer


def rec(i, account="a"):
    return {"_id": f"r{i}", "account_id": account, "credits": i, "lease": "p1"}


def test_usage_take_done_in_order():
    buffer = UsageBuffer(max_records=100)
    for i in range(5):
        buffer.add(rec(i))
    seq, batch = buffer.take(3)
    assert [r["_id"] for r in batch] == ["r0", "r1", "r2"]
    assert len(buffer) == 5
    buffer.done()
    assert len(buffer) == 2
    next_seq, batch = buffer.take(10)
    assert next_seq == seq + 1 and [r["_id"] for r in batch] == ["r3", "r4"]
    buffer.done()
    assert len(buffer) == 0
    assert buffer.take(10)[1] == []


def test_usage_unconfirmed_batch_is_retried_identically():
    """A retry must write the very same documents (same batch number, same records), or it could double-write."""
    buffer = UsageBuffer(max_records=100)
    for i in range(3):
        buffer.add(rec(i))
    first = buffer.take(10)
    buffer.add(rec(3))  # arrives while the batch is unconfirmed
    again = buffer.take(10)
    assert again[0] == first[0] and [r["_id"] for r in again[1]] == ["r0", "r1", "r2"]
    buffer.done()
    later = buffer.take(10)
    assert later[0] == first[0] + 1 and [r["_id"] for r in later[1]] == ["r3"]


def test_usage_for_account_includes_in_flight():
    buffer = UsageBuffer(max_records=100)
    buffer.add(rec(1, "a"))
    buffer.add(rec(2, "b"))
    buffer.add(rec(3, "a"))
    buffer.take(2)
    assert [r["_id"] for r in buffer.for_account("a")] == ["r1", "r3"]
    assert [r["_id"] for r in buffer.for_account("b")] == ["r2"]
    assert buffer.for_account("c") == []
    buffer.done()
    assert [r["_id"] for r in buffer.for_account("a")] == ["r3"]


def test_usage_full_at_max_records_counting_in_flight():
    buffer = UsageBuffer(max_records=3)
    buffer.add(rec(1))
    buffer.add(rec(2))
    assert not buffer.full
    buffer.take(2)
    buffer.add(rec(3))
    assert buffer.full
    buffer.done()
    assert not buffer.full

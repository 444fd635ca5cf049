"""A short soak (bench/soak.py, CI-sized): real processes, many accounts and keys, faults from the
upstream, revocations, top-ups and a SIGTERM + restart under load; then the ledger, account by account. It
asserts what a user would notice (nothing lost or counted twice, the ledger exact), not how many calls the
machine managed: a busy one serves a fraction of an idle one's (`bench/soak.py --seconds 120` measures that)."""

from bench import soak


def test_graceful_restart_under_mixed_load_and_faults_loses_nothing():
    args = soak.parser().parse_args(
        ["--seconds", "10", "--accounts", "6", "--keys-per-account", "3", "--concurrency", "8", "--seed", "7"]
        # One call in ten fails upstream: a busy machine's few dozen calls still meet some (the default 2 % did not).
        + ["--faults", "error=503:0.1,latency=5"]
    )
    figures = soak.run(args)
    assert figures["data_calls_served"] > 0, figures  # there was load; how much is the machine's pace
    assert figures["faults"]["upstream_failures_seen"] > 0, figures  # the faults were real...
    assert [e["exit_code"] for e in figures["faults"]["restarts"]] == [0, 0]  # ...and so were the SIGTERMs
    assert figures["records_lost"] == 0 and figures["records_without_a_client_200"] == 0, figures
    assert figures["duplicate_records"] == 0 and figures["revoked_key_violations"] == 0, figures
    assert figures["credits_charged_seen_by_clients"] == figures["credits_recorded"], figures
    assert figures["accounts_reconciled"] == "6/6" and figures["leases_left"] == 0, figures
    assert figures["ok"], figures

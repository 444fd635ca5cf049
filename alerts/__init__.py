"""Alert rules and the crossing detector: what an account wants to hear about (`rules.py`: kinds, thresholds,
event types and payloads) and when it happened (`detector.py`: fed by what the meter already knows, in a
background loop; hands events to webhooks/, whose unique event ids make each crossing one event however
many processes see it)."""

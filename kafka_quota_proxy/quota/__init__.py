"""Pure quota logic, as a Kafka broker measures and enforces it, with the clock injected.

rate.py (the windowed Rate), pacer.py (the proxy's own pacing of a sensor's bytes, beside the
Rate, not Kafka's), throttle.py (QuotaUtils), token_bucket.py (KIP-599), resolution.py (the
eight-level entity precedence and shared sensors), sensors.py (the measurement store),
managers.py (the quota managers), admin_api.py (DescribeClientQuotas and AlterClientQuotas) and
producer_ids.py (KIP-936's time-rotated Bloom filters of seen producer ids). Nothing here does
I/O or reads a clock. What the running proxy builds from them (the managers per scope, the
quotas in force, who may change them) is proxy/quota_runtime/.
"""

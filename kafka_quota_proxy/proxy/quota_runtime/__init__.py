"""The proxy's quotas at run time: the managers its stages charge, one set per measurement scope
(engine.py), the quotas in force, from the config file overlaid by AlterClientQuotas and kept in
the state file (control.py), who may change them (access.py) and the trail of each change
(audit.py). The quota algorithms themselves, pure and clock-free, are kafka_quota_proxy/quota/."""

"""Pure quota logic (rates, throttle times, entity resolution), with the clock injected.

Empty until the quota engine lands: the proxy core forwards without charging anything.
"""

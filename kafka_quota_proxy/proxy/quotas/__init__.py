"""The quota engine the stages charge, and where its quotas come from."""

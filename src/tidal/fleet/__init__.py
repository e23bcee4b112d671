"""The global fleet: regions, pools of rollout workers that join and leave under leases, the
HTTP coordinator remote pools join, and a simulator of global deployments (docs/fleet.md)."""

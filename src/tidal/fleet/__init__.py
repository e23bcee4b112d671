"""The global fleet: regions, pools of rollout workers that join and leave under leases, the
HTTP coordinator remote pools join, and a simulator of global deployments (docs/fleet.md).

Only HTTP crosses a region's border: assignments down, signed batches of rollout results up
(``wire``), each checked for who sent it (``auth``) and against what was assigned (``verify``).
"""

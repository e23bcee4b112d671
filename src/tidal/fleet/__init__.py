"""The global fleet: rollout workers anywhere that join the orchestrator over HTTP with a lease.

Only HTTP crosses a region's border: assignments down, signed batches of rollout results up
(``wire``), each checked for who sent it (``auth``) and against what was assigned (``verify``).
"""

"""tidal.integrity: catch reward hacking and environment probing from what tidal itself saw.

records.py types the evidence an episode leaves (workspace before/after, actions, sandbox trace)
and the findings detectors report; detectors read evidence and never raise on odd input.
"""

"""What an episode leaves behind for integrity checking (its actions, sandbox trace and grader
verdicts: records.py), the ``[env.integrity]`` section, and what a run does with the detectors'
findings (policy.py: log, screen or penalise; canary metrics). The detectors themselves are an
extension (tidal.integrity, plugged in through the ``tidal.detectors`` entry points)."""

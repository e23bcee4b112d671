"""The built-in environment families, one package each (tasks, environment, config, grader and
mid-training corpus together): ``funcs`` (the default single-turn coding family), ``ledger``
(long-horizon: facts read early, needed many context windows later) and ``fixit`` (the
documented multi-turn tool example). Each is selected by ``env.name`` (tidal.env.registry)."""

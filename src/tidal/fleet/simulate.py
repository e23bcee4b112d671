"""A discrete-event simulator of a fleet (``tidal simulate``): the orchestrator's own scheduling,
lease and staleness code on a simulated clock, with models of everything that takes time.

What runs here is tidal's code, not a re-implementation of it:

    Scheduler (plan, dispatch, complete, add_worker, remove_worker, ready, take)
    split_step (how a step is split into assignments)       orchestrator/scheduler.py
    staleness_gate (what is trained, what dropped)          orchestrator/planning.py
    LeaseTable (grant, renew, release, expire)              fleet/lease.py
    capacity_at (pool schedules)                            orchestrator/topology.py

and the driver loop mirrors ``Run._drive``: plan within the staleness bound, dispatch to idle
workers, collect results, and, when the oldest step is complete, gate, train and publish on the
trainer's thread while the driver keeps dispatching (``SimModel.dispatch_during_train = False``
models the older loop that trained in the driver's thread); held-out evaluations block both. What takes
time is modelled (``SimModel``): generation (tokens/s per worker times ``pool.speed``), rollout
lengths (lognormal, drawn per step so a re-run assignment regenerates the same tokens, as the
real seeds do), grading, the trainer's step (fixed + per token), publishing, held-out
evaluations, the upload of trajectories, and each region's weight delivery from first principles
(``tidal.sync.pull.predict_delivery_s``: latency, bytes over bandwidth, the receiving CPU's decode). A worker in
region R starts an assignment needing ``min_version`` only once that version has reached R.

Workers of a pool follow ``capacity_at``: joiners get a lease and catch up (start-up, then the
full weights from their region's relay); leavers are killed and let their lease expire (or
release it, ``SimModel.leave``), and the scheduler re-queues what they held. A cut-off region
(``SimModel.partitions``) renews no lease and receives no weights; its results arrive when it is
back (a duplicate of work re-run elsewhere is dropped by the scheduler and counted).

Deterministic given the config, the model and the seed. Its limits are in docs/fleet.md.

The parts: the model's constants (sim_model.SimModel), the world of regions, pools, links and
their costs (sim_world.SimWorld), the event loop (sim_events.Simulation) and the prediction it
yields (sim_report.SimResult); this module loads a recipe and runs it (simulate_config).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from tidal.fleet.sim_events import Simulation
from tidal.fleet.sim_model import SimModel, SimulateError, sim_model_from
from tidal.fleet.sim_report import SimResult

if TYPE_CHECKING:
    from tidal.config import TidalConfig


EXAMPLES = ("local", "global")
"""Example recipes shipped in tidal/fleet/examples/, found by name."""


def simulate_config(cfg: TidalConfig, model: SimModel, steps: int, seed: int) -> SimResult:
    """Simulate ``steps`` trainer steps of ``cfg``'s run (its [orchestrator] and [fleet]) under
    ``model``; deterministic given the arguments."""
    return Simulation(cfg.orchestrator, cfg.fleet, model, steps, seed).run()


def example_path(name: str) -> Path:
    """A shipped example recipe by name ("local", "global"), or ``name`` as a path."""
    if name in EXAMPLES:
        return Path(str(resources.files("tidal.fleet") / "examples" / f"{name}.toml"))
    return Path(name)


def load_simulate_recipe(path: str | Path, overrides: list[str] | None = None) -> tuple[TidalConfig, SimModel]:
    """A simulate recipe: a tidal recipe plus a ``[simulate]`` table (the SimModel), split off
    before tidal's own config (which forbids unknown sections) is validated. Dotted overrides
    apply to either (``--orchestrator.max_staleness 0``, ``--simulate.tokens_per_s 900``)."""
    from tidal.config.loader import config_from_tree, parse_overrides

    p = example_path(str(path))
    if not p.is_file():
        raise SimulateError(f"simulate recipe not found: {p} (or name one of the examples: {', '.join(EXAMPLES)})")
    try:
        tree = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SimulateError(f"simulate recipe {p} is not valid TOML: {e}") from None
    sim = tree.pop("simulate", None)
    if not isinstance(sim, dict):
        raise SimulateError(f"simulate recipe {p} has no [simulate] table: add the model's constants "
                            f"(`tidal simulate calibrate RUN_DIR` writes them)")
    rest = parse_overrides(overrides or [])
    for key in [k for k in rest if k.startswith("simulate.")]:
        sim[key.removeprefix("simulate.")] = rest.pop(key)
    return config_from_tree(tree, rest), sim_model_from(sim)

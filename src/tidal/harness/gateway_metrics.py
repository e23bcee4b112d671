"""A step's gateway statistics (metrics.jsonl ``gateway/*``), from its trajectories' info."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GatewayMeans:
    turns: float
    """Chat requests per episode."""
    history_match_fraction: float
    """Of the requests after each episode's first, the share whose history was what the episode
    was served, so they extended their segment with no re-tokenisation (1.0 when there were
    none)."""
    new_segments: float
    """Segments per episode (1 for a harness that never edits its history)."""
    malformed_calls: float
    """Replies per episode whose tool-call markup did not parse (returned as content)."""
    overhead_ms: float
    """Mean time a request spent in the gateway beyond the engine, per turn."""

    @classmethod
    def of(cls, trajs) -> GatewayMeans | None:
        """None unless the trajectories came through the gateway."""
        infos = [t.info for t in trajs if "gateway_turns" in t.info]
        if not infos:
            return None
        n = len(infos)
        turns = sum(i["gateway_turns"] for i in infos)
        matched = sum(i["gateway_history_matched"] for i in infos)
        later = turns - sum(1 for i in infos if i["gateway_turns"] > 0)
        timed = [i["gateway_overhead_ms"] for i in infos if "gateway_overhead_ms" in i]
        return cls(turns=turns / n, history_match_fraction=matched / later if later else 1.0,
                   new_segments=sum(i["gateway_new_segments"] for i in infos) / n,
                   malformed_calls=sum(i["gateway_malformed_calls"] for i in infos) / n,
                   overhead_ms=sum(timed) / len(timed) if timed else 0.0)

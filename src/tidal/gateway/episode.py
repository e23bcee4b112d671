"""One episode run by an outside harness: its process, its budgets, its reward.

    task = the family's environment.reset(task)     (the prompt, as chat messages)
    start `command` in a fresh workspace with OPENAI_BASE_URL, OPENAI_API_KEY (this episode's
        key), TIDAL_TASK_FILE; the task JSON on stdin
    wait until the harness exits, answers, posts its reward, breaks a budget or runs out of time
    stop its whole process group; grade: the family's environment.step(answer), or the posted
        reward; the reason is recorded either way
    the trajectory: the gateway's segments (history.py), trained exactly as sampled

A harness that hangs, crashes, floods requests or exceeds a budget ends its own episode with a
recorded reason (timeout, crashed, turn_budget, token_budget, context, no_answer) and nothing
else: the other episodes and the run go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from tidal.env.base import StepResult, final_answer
from tidal.gateway.config import GatewayConfig
from tidal.gateway.server import Channel, Gateway
from tidal.harness.chat_format import as_messages
from tidal.harness.episode import EpisodeResult, check_integrity

log = logging.getLogger(__name__)

ANSWER_FILE = "answer.txt"
"""A harness may leave its answer in this file of its workspace instead of posting it."""
LOG_FILE = ".tidal-harness.log"
"""The harness's stdout and stderr, in its workspace (its tail is logged when it crashes)."""
STOP_GRACE_S = 2.0
"""Seconds between SIGTERM and SIGKILL when the harness is stopped."""


def harness_argv(command: str) -> list[str]:
    """The command's arguments; ``{python}`` stands for this interpreter (tidal's venv)."""
    return [sys.executable if a == "{python}" else a for a in shlex.split(command)]


class HarnessEpisode:
    """Runs ``env`` (the task family's environment, which grades) on one task through an outside
    harness served by ``gateway``."""

    def __init__(self, env, gateway: Gateway, cfg: GatewayConfig, index: int, seed: int | None):
        self.env, self.gateway, self.cfg, self.index, self.seed = env, gateway, cfg, index, seed

    async def run(self, task: Any) -> EpisodeResult:
        workspace = Path(tempfile.mkdtemp(prefix="tidal-harness-"))
        channel = self.gateway.open(self.index, self.seed)
        try:
            messages = as_messages(await self.env.reset(task))
            exit_code = await self._run_harness(task, messages, channel, workspace)
            final = await self._grade(channel, exit_code, workspace)
            result = self._result(channel, final)
            result.integrity = await asyncio.to_thread(check_integrity, self.env)
            return result
        finally:
            self.gateway.close(channel)
            await self.env.close()
            shutil.rmtree(workspace, ignore_errors=True)

    # ------------------------------------------------------------------ the process

    async def _run_harness(self, task, messages, channel: Channel, workspace: Path) -> int | None:
        """Run the harness until it exits or the episode ends; its exit code, or None if it was
        stopped (channel.ended says why; "timeout" is set here)."""
        payload = json.dumps({"task_id": task.task_id, "messages": messages,
                              "prompt": messages[-1].get("content", "")})
        task_file = workspace / "task.json"
        task_file.write_text(payload)
        env = {**os.environ, "OPENAI_BASE_URL": self.gateway.base_url,
               "OPENAI_API_KEY": channel.key, "TIDAL_TASK_FILE": str(task_file),
               "TIDAL_ANSWER_FILE": str(workspace / ANSWER_FILE)}
        proc = await self._launch(env, task_file, workspace)
        try:
            exited = asyncio.ensure_future(proc.exited)
            ended = asyncio.ensure_future(channel.done.wait())
            done, _ = await asyncio.wait({exited, ended}, return_when=asyncio.FIRST_COMPLETED,
                                         timeout=self.cfg.timeout_s)
            ended.cancel()
            if exited in done:
                return exited.result()
            if not done:
                channel.end("timeout")
            return None
        finally:
            await proc.stop()

    async def _launch(self, env: dict, task_file: Path, workspace: Path) -> "Harness":
        """The harness's process: forked from the zygote (env.args.preload, a ``{python}``
        command), else started afresh."""
        argv = harness_argv(self.cfg.command)
        log_file = workspace / LOG_FILE
        if self.cfg.preload and argv[0] == sys.executable:
            from tidal.gateway.zygote import zygote

            child = zygote(tuple(self.cfg.preload), self.cfg.warmup).spawn(
                argv, str(workspace), env, str(task_file), str(log_file))
            if not await asyncio.to_thread(child.started.wait, 30) or child.pid is None:
                raise RuntimeError("the harness fork server did not start a harness")
            return Harness(child.pid, child.exited)
        with open(task_file, "rb") as stdin, open(log_file, "wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=workspace, env=env, stdin=stdin, stdout=out, stderr=out,
                start_new_session=True)
        return Harness(proc.pid, proc.wait())

    # ------------------------------------------------------------------ the reward

    async def _grade(self, channel: Channel, exit_code: int | None, workspace: Path) -> StepResult:
        """The episode's final step: graded answer, posted reward, or an ending with no reward."""
        if channel.ended in ("turn_budget", "token_budget", "context", "timeout"):
            return await self.env.end(channel.ended)
        if self.cfg.reward == "harness":
            if channel.reward is None:
                return StepResult("", 0.0, True, {"reason": self._no_result(exit_code, workspace)})
            reward, reason = channel.reward
            return StepResult("", reward, True, {"reason": reason})
        answer = channel.answer
        answer_file = workspace / ANSWER_FILE
        if answer is None and answer_file.is_file():
            answer = answer_file.read_text(errors="replace")
        if answer is None:
            return await self.env.end(self._no_result(exit_code, workspace))
        return await final_answer(self.env, answer)

    def _no_result(self, exit_code: int | None, workspace: Path) -> str:
        """Why a harness left neither answer nor reward: it crashed, or exited without one."""
        if exit_code:
            tail = (workspace / LOG_FILE).read_text(errors="replace")[-2000:]
            log.warning("harness %r exited with code %s without an answer; its output ends:\n%s",
                        self.cfg.command, exit_code, tail)
            return "crashed"
        return "no_answer"

    def _result(self, channel: Channel, final: StepResult) -> EpisodeResult:
        history = channel.history
        info = dict(final.info)
        info.update(gateway_turns=channel.turns, gateway_history_matched=history.matched,
                    gateway_new_segments=history.new_segments,
                    gateway_malformed_calls=channel.malformed_calls)
        if channel.overhead_ms:
            info["gateway_overhead_ms"] = sum(channel.overhead_ms) / len(channel.overhead_ms)
        reason = str(info.get("reason", channel.ended or "done"))
        info["reason"] = reason
        result = EpisodeResult([], final.reward, reason, info, turns=channel.turns,
                               model_tokens=channel.model_tokens, window=self.gateway.window)
        history.fill(result)
        return result


class Harness:
    """A running harness: its process group and its exit."""

    def __init__(self, pid: int, exited):
        self.pid = pid
        self.exited = asyncio.ensure_future(exited)

    async def stop(self) -> None:
        """Stop its whole process group (SIGTERM, then SIGKILL after STOP_GRACE_S): children it
        left behind too."""
        if not self.exited.done():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exited), STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exited), STOP_GRACE_S)

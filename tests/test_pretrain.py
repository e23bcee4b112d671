"""Mid-training: corpus files, packing, the LR schedule, a short run that learns, the cache."""

import json
import math
import os

import pytest
import torch

from tidal.config import TidalConfig
from tidal.model import ByteTokenizer, from_pretrained
from tidal.pretrain import cache as cache_mod
from tidal.pretrain.cache import cache_key, cached_pretrained
from tidal.pretrain.config import PretrainConfig
from tidal.pretrain.corpus import CorpusError, load_corpus, pack, pack_documents
from tidal.pretrain.loop import budget_bound, lr_at, pretrain, torch_threads

TOK = ByteTokenizer()


def tiny_cfg(tmp_path, env=None, **pretrain):
    return TidalConfig.model_validate({
        "env": env or {},
        "model": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=64),
        "engine": dict(max_seq_len=64, max_new_tokens=16),
        "pretrain": {**dict(seq_len=32, batch_size=8, max_steps=30, warmup_steps=3, lr=1e-2, log_every=5,
                            cache_dir=str(tmp_path / "cache")), **pretrain},
    })


# ---------------------------------------------------------------- corpus files


def test_load_corpus_reads_jsonl_lines_and_whole_text_files(tmp_path):
    j = tmp_path / "a.jsonl"
    j.write_text('{"text": "def f():\\n    return 1\\n"}\n\n{"text": "x = 2", "id": 7}\n'
                 '{"prompt": "# double\\n", "completion": "y = 2 * x"}\n')
    t = tmp_path / "b.txt"
    t.write_text("def g():\n    pass\n\n\ndef h():\n    pass\n")
    assert load_corpus([j, t]) == ["def f():\n    return 1\n", "x = 2", ("# double\n", "y = 2 * x"), t.read_text()]


def test_load_corpus_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(CorpusError, match="not found: .*missing.jsonl"):
        load_corpus([tmp_path / "missing.jsonl"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: not valid JSON"):
        load_corpus([bad])
    no_text = tmp_path / "no_text.jsonl"
    no_text.write_text('{"text": "ok"}\n{"content": "x"}\n')
    with pytest.raises(CorpusError, match=r'no_text.jsonl:2: .*"text"'):
        load_corpus([no_text])
    with pytest.raises(CorpusError, match="pretrain.corpus"):
        load_corpus([])


# ---------------------------------------------------------------- packing


def test_pack_wraps_docs_in_bos_eos_and_drops_the_ragged_tail():
    rows, mask = pack(["ab", "c"], TOK, 3)  # stream: bos a b eos bos c eos -> 7 tokens, 2 rows
    b, e = TOK.bos_id, TOK.eos_id
    assert rows.dtype == torch.long
    assert rows.tolist() == [[b, 97, 98], [e, b, 99]] and mask.tolist() == [[1, 1, 1], [1, 1, 1]]


def test_a_prompt_completion_document_trains_its_completion_only():
    for packing in (pack, pack_documents):
        rows, mask = packing([("ab", "cd"), "x"], TOK, 9)  # bos a b c d eos | bos x eos
        b, e = TOK.bos_id, TOK.eos_id
        kept = [t for r, k in zip(rows.tolist(), mask.tolist()) for t, m in zip(r, k) if m]
        assert kept == [99, 100, e, b, 120, e], packing  # not bos, a, b: the prompt is not predicted


def test_pack_byte_fast_path_matches_the_generic_tokenizer_path():
    class Generic:  # any tokenizer with encode/bos/eos takes the generic path
        bos_id, eos_id = TOK.bos_id, TOK.eos_id
        encode = staticmethod(TOK.encode)

    docs = ["héllo wörld", "", "def f(x):\n    return x * 2\n", "🙂"] * 5
    docs += [("def f(x):", " return x")] * 3
    for ours, generic in zip(pack(docs, TOK, 16), pack(docs, Generic(), 16)):
        assert torch.equal(ours, generic)


def test_pack_refuses_a_corpus_shorter_than_one_row():
    with pytest.raises(CorpusError, match="seq_len"):
        pack(["ab"], TOK, 16)


def test_pack_documents_keeps_every_document_whole_in_one_row():
    docs = ["abcdef", "gh", "ijk", "l", "mnopqrstuvwxyz"]  # 8, 4, 5, 3, 16 tokens with bos/eos
    ids, mask = pack_documents(docs, TOK, 9)
    b, e = TOK.bos_id, TOK.eos_id
    rows = [[t for t, m in zip(r, k) if m] for r, k in zip(ids.tolist(), mask.tolist())]
    # the 16-token doc is cut into 9 + 7; best fit decreasing: [9], [8], [7], [5, 4], [3]
    assert [bytes(t for t in r if t < 256).decode() for r in rows] == ["mnopqrst", "abcdef", "uvwxyz", "ijkgh", "l"]
    assert rows[3] == [b, 105, 106, 107, e, b, 103, 104, e]  # the 5-token doc first, then the 4
    assert all(t == e for r, k in zip(ids.tolist(), mask.tolist()) for t, m in zip(r, k) if not m)
    assert mask.dtype == torch.float32 and ids.dtype == torch.long


def test_pack_documents_says_when_documents_are_cut(caplog):
    pack_documents(["abc", "x" * 20], TOK, 9)
    assert "1 of 2 documents are longer than pretrain.seq_len = 9" in caplog.text
    assert "pretrain.seq_len = 22 would hold all of them" in caplog.text


def test_pack_documents_fills_short_code_documents_densely():
    docs = [("x" * n) for n in range(75, 226, 7)] * 20
    ids, mask = pack_documents(docs, TOK, 288)
    assert mask.sum() == sum(len(d) + 2 for d in docs) and mask.mean() > 0.9


# ---------------------------------------------------------------- schedule


def test_lr_warms_up_then_decays_to_ten_percent_by_steps_or_by_time():
    pc = PretrainConfig(lr=1.0, warmup_steps=4, max_steps=104, time_budget_s=100.0)
    assert [lr_at(pc, s, 0.0) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(pc, 4, 0.0) == pytest.approx(1.0)
    assert lr_at(pc, 54, 0.0) == pytest.approx(0.55)  # half-way: 0.1 + 0.9 * 0.5
    assert lr_at(pc, 104, 0.0) == pytest.approx(0.1)
    # the clock plays no part before the last 10% of the budget (so runs are reproducible) ...
    assert all(lr_at(pc, s, t) == lr_at(pc, s, 0.0) for s in range(104) for t in (1.0, 50.0, 90.0))
    # ... then a run too slow to finish its steps anneals against it, to the floor at the end
    step_frac = 6 / 100
    half_way = step_frac + (1 - step_frac) * 0.5
    assert lr_at(pc, 10, 95.0) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(half_way * math.pi)))
    assert lr_at(pc, 10, 100.0) == pytest.approx(0.1)


# ---------------------------------------------------------------- the loop and the cache


DOCS = ["def add(a, b):\n    return a + b\n", "def mul(a, b):\n    return a * b\n"] * 40


def test_short_pretrain_on_repeated_text_lowers_the_loss(tmp_path):
    cfg = tiny_cfg(tmp_path)
    path = pretrain(cfg, tmp_path / "out", docs=DOCS, progress=False)
    assert path == tmp_path / "out" / "model"
    lines = [json.loads(x) for x in (tmp_path / "out" / "pretrain_metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [5, 10, 15, 20, 25, 30]
    assert set(lines[0]) == {"step", "loss", "lr", "tokens_per_s", "elapsed_s", "threads", "budget_bound"}
    assert not any(x["budget_bound"] for x in lines) and not budget_bound(path)
    assert lines[0]["loss"] > 4.0  # ~ln(260) = 5.56 at init
    assert lines[-1]["loss"] < lines[0]["loss"] - 1.5
    model = from_pretrained(path)
    assert model.config.hidden_size == 32
    assert (path / "tidal_tokenizer.txt").is_file()


def test_time_budget_stops_the_run(tmp_path):
    cfg = tiny_cfg(tmp_path, max_steps=10_000, time_budget_s=1.5, warmup_steps=0)
    path = pretrain(cfg, tmp_path / "out", docs=DOCS, progress=False)
    last = json.loads((tmp_path / "out" / "pretrain_metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] < 10_000 and 1.5 <= last["elapsed_s"] < 6
    # annealed against the clock in the budget's last 10% (by steps the LR would be at its peak)
    assert last["lr"] < 0.5 * cfg.pretrain.lr
    assert last["budget_bound"] and budget_bound(path)  # and says so: it depends on the clock


def test_thread_tuner_keeps_the_faster_count_and_probes_again():
    from tidal.pretrain.loop import ThreadTuner

    before = torch.get_num_threads()
    cost = {2: 1.0, 1: 3.0}  # seconds per token at each thread count
    tuner = ThreadTuner([2, 1], probe=3, hold=4, max_hold=8)
    used = []
    try:
        for step in range(40):
            if step == 20:
                cost = {2: 5.0, 1: 3.0}  # other work arrives: one thread is now faster
            tuner.before_step()
            used.append(torch.get_num_threads())
            tuner.after_step(cost[used[-1]])
    finally:
        torch.set_num_threads(before)
    assert used[:6] == [2, 1, 2, 1, 2, 1]  # the probe interleaves the choices
    assert used[6:10] == [2, 2, 2, 2]  # then holds the faster one
    assert used[34:38] == [1, 1, 1, 1]  # a later probe (steps 28-33) noticed the change


def test_pretrain_in_a_child_process_with_its_own_environment(tmp_path, monkeypatch):
    from tidal.pretrain.loop import pretrain_in_child

    monkeypatch.setenv("TIDAL_TEST_PARENT_ONLY", "1")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    cfg = tiny_cfg(tmp_path, corpus=[str(corpus)], max_steps=2, warmup_steps=0)
    path = pretrain_in_child(cfg, tmp_path / "out", {"TIDAL_TEST_PARENT_ONLY": None}, progress=False)
    assert path == tmp_path / "out" / "model" and from_pretrained(path).config.hidden_size == 32
    assert os.environ["TIDAL_TEST_PARENT_ONLY"] == "1"  # restored here
    with pytest.raises(CorpusError):  # the child's errors are raised in the parent
        bad = tiny_cfg(tmp_path, corpus=[str(tmp_path / "missing.jsonl")], max_steps=1)
        pretrain_in_child(bad, tmp_path / "out2", {}, progress=False)


def test_thread_count_is_restored():
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1
    with torch_threads(0):
        assert torch.get_num_threads() == 1


def test_cache_pretrains_once_then_reuses(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    cfg = tiny_cfg(tmp_path, corpus=[str(corpus)], max_steps=3, warmup_steps=1)
    first = cached_pretrained(cfg, progress=False)
    assert first.parent.name == cache_key(cfg) and (first.parent / "tidal_config.json").is_file()
    assert [p.name for p in first.parent.parent.iterdir()] == [cache_key(cfg)]  # no staging left

    def must_not_run(*a, **k):
        raise AssertionError("pretrain ran although a cached model exists")

    monkeypatch.setattr(cache_mod, "pretrain", must_not_run)
    assert cached_pretrained(cfg, progress=False) == first
    # logging cadence and cache location do not change the weights; lr and the seed do
    assert cache_key(tiny_cfg(tmp_path, corpus=[str(corpus)], max_steps=3, warmup_steps=1, log_every=1)) == cache_key(cfg)
    assert cache_key(tiny_cfg(tmp_path, corpus=[str(corpus)], max_steps=3, warmup_steps=1, lr=1e-3)) != cache_key(cfg)
    reseeded = cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": 1})})
    assert cache_key(reseeded) != cache_key(cfg)


def test_cache_ignores_a_crashed_run(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path, max_steps=2, warmup_steps=0, corpus_docs=1)

    def crash(cfg, out_dir, **kw):
        (out_dir / "model").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_mod, "pretrain", crash)
    with pytest.raises(KeyboardInterrupt):
        cached_pretrained(cfg, progress=False)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_trimming_padding_after_the_last_trained_token_changes_no_loss():
    """Demonstration rows are right padded; the cut batch gives the loss of the whole one (a
    causal model never looks ahead), and a batch with nothing trained is left whole."""
    from tidal.model.presets import preset
    from tidal.model.qwen3 import build_model
    from tidal.pretrain.loop import trim_batch

    ids = torch.randint(0, 256, (3, 40))
    mask = torch.zeros(3, 40)
    mask[0, 5:12] = 1
    mask[2, 20:27] = 1
    cut_ids, cut_mask = trim_batch(ids, mask)
    assert cut_ids.shape == (3, 27) and torch.equal(cut_ids, ids[:, :27])
    model = build_model(preset("tiny"), seed=0)
    with torch.no_grad():
        def loss(i, m):
            per = torch.nn.functional.cross_entropy(model(i[:, :-1]).transpose(1, 2), i[:, 1:],
                                                    reduction="none")
            return (per * m[:, 1:]).sum() / m[:, 1:].sum()
        torch.testing.assert_close(loss(cut_ids, cut_mask), loss(ids, mask))
    nothing = torch.zeros(3, 40)
    assert trim_batch(ids, nothing)[0].shape == (3, 40)


# ---------------------------------------------------------------- the corpus from the environment

CORPUS_ENV = """
from tidal.env import EnvironmentSpec

def load_environment(sandbox=None, word: str = "zebra"):
    return EnvironmentSpec("corpus_env", make=None, sample_tasks=lambda n, s, h: [],
                           build_corpus=lambda n, seed: [f"{word} {i} seed {seed}. " * 4 for i in range(n)],
                           corpus_version=3)
"""

NO_CORPUS_ENV = """
from tidal.env import EnvironmentSpec

def load_environment(sandbox=None):
    return EnvironmentSpec("bare", make=None, sample_tasks=lambda n, s, h: [])
"""


@pytest.fixture
def env_modules(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "pretrain_corpus_env.py").write_text(CORPUS_ENV)
    (tmp_path / "pretrain_bare_env.py").write_text(NO_CORPUS_ENV)


def test_pretrain_mid_trains_on_the_selected_environments_corpus(tmp_path, env_modules, monkeypatch):
    from tidal.pretrain import loop

    cfg = tiny_cfg(tmp_path, env={"name": "pretrain_corpus_env", "args": {"word": "quokka"}},
                   corpus_docs=20, max_steps=2, warmup_steps=0)
    packed = []
    monkeypatch.setattr(loop, "pack_documents", lambda docs, *a: packed.append(docs) or pack_documents(docs, *a))
    pretrain(cfg, tmp_path / "out", progress=False)
    assert packed == [[f"quokka {i} seed 0. " * 4 for i in range(20)]]


def test_an_environment_without_a_corpus_is_one_error_naming_both_fixes(tmp_path, env_modules, capsys):
    from tidal.cli import main
    from tidal.env import NoCorpus
    from tidal.pretrain.loop import corpus_documents

    with pytest.raises(NoCorpus, match=r"set pretrain\.corpus .* build_corpus\(n_docs, seed\)"):
        corpus_documents(tiny_cfg(tmp_path, env={"name": "pretrain_bare_env"}))
    assert main(["pretrain", "--dry-run", "--env.name", "pretrain_bare_env"]) == 2
    assert "pretrain.corpus" in capsys.readouterr().err
    corpus = tmp_path / "c.txt"
    corpus.write_text("text")
    assert main(["pretrain", "--dry-run", "--env.name", "pretrain_bare_env",
                 "--pretrain.corpus", str(corpus)]) == 0


def test_cache_key_follows_the_environment_and_only_what_makes_the_corpus(tmp_path, env_modules):
    base = tiny_cfg(tmp_path)
    key = cache_key(base)
    assert cache_key(tiny_cfg(tmp_path, env={"name": "pretrain_corpus_env"})) != key  # env.name alone
    assert cache_key(tiny_cfg(tmp_path, env={"args": {"max_level": 2}})) != key
    assert cache_key(tiny_cfg(tmp_path, env={"args": {"max_level": 3}})) == key  # the default, written out
    assert cache_key(tiny_cfg(tmp_path, env={"sandbox": {"timeout_s": 1.0}})) == key
    hashed = cache_mod._hashed(tiny_cfg(tmp_path, env={"name": "pretrain_corpus_env"}))
    assert hashed["corpus"] == {"environment": {"name": "pretrain_corpus_env", "args": {"word": "zebra"},
                                                "corpus_version": 3}}
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "x"}\n')
    files = tiny_cfg(tmp_path, corpus=[str(corpus)])
    assert cache_key(tiny_cfg(tmp_path, corpus=[str(corpus)], corpus_docs=7)) == cache_key(files)
    assert cache_key(tiny_cfg(tmp_path, env={"name": "pretrain_corpus_env"}, corpus=[str(corpus)])) \
        == cache_key(files)  # the files are the corpus: the environment does not matter

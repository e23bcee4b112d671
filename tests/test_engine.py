"""The inference engine against the plainest reference there is: full forwards, no cache.

Models are the tiny presets with a wider init (0.1) so greedy text varies and distributions
are far from uniform; with the default 0.02 a random model repeats one token, which would let
slot or cache mix-ups go unnoticed.
"""

import math

import pytest
import torch

from tidal.engine.config import EngineConfig
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationRequest
from tidal.engine.sampling import greedy, sample
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
PROMPTS = [TOK.encode(s) for s in ("x", "def f(", "hello world", "print(1 + 2)\n#")]


def make_model(name: str = "tiny", seed: int = 0):
    cfg = preset(name).model_copy(update={"initializer_range": 0.1})
    return build_model(cfg, seed=seed).eval()


@pytest.fixture(scope="module")
def dense():
    return make_model("tiny")


@pytest.fixture(scope="module")
def moe():
    return make_model("tiny-moe")


def engine_for(model, tokenizer=TOK, **overrides) -> Engine:
    cfg = {"max_batch_size": 4, "max_seq_len": 64, "max_new_tokens": 32, "temperature": 0.0,
           "stop": [], **overrides}
    return Engine(model, tokenizer, EngineConfig(**cfg))


@torch.inference_mode()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    """[T, V] logits of one uncached forward over ids."""
    return model(torch.tensor([ids]))[0]


def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(full_logits(model, ids)[-1].argmax()))
    return ids[len(prompt):]


def reference_logprobs(model, prompt, completion, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of a full forward at each completion token (T=0 -> T=1)."""
    logits = full_logits(model, prompt + completion)[len(prompt) - 1 : -1]
    scaled = logits / (temperature or 1.0)
    return torch.log_softmax(scaled, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


@pytest.mark.parametrize("max_prefill_tokens", [8192, 12])
def test_greedy_batch_equals_full_forward_loop(dense, max_prefill_tokens):
    """Several prompts of different lengths share a batch (right-padded prefill, or several
    prefill groups when the token budget is small) and still give exactly the naive tokens."""
    engine = engine_for(dense, max_prefill_tokens=max_prefill_tokens)
    n = 12
    results = engine.generate([GenerationRequest(p, max_new_tokens=n, ignore_eos=True) for p in PROMPTS])
    for prompt, r in zip(PROMPTS, results):
        assert r.prompt_ids == prompt
        assert r.token_ids == naive_greedy(dense, prompt, n)
        assert r.finish_reason == "length"
        assert r.text == TOK.decode(r.token_ids)
        assert r.versions == [0] * n and r.experts is None
        ref = reference_logprobs(dense, prompt, r.token_ids, 0.0)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)
    assert not engine.has_work


def test_abort_all_leaves_an_empty_engine_that_generates_as_a_fresh_one(dense):
    """What a failed rollout left in the engine (running, waiting, finished but unreturned) is
    dropped, and the next requests get exactly what a fresh engine gives them."""
    engine = engine_for(dense, max_batch_size=2)
    for p in PROMPTS:  # 2 run, 2 wait
        engine.submit(GenerationRequest(p, max_new_tokens=12, ignore_eos=True))
    engine.step()
    assert engine.abort_all() == len(PROMPTS) and not engine.has_work
    assert engine.step() == []
    again = engine.generate([GenerationRequest(p, max_new_tokens=6, ignore_eos=True) for p in PROMPTS[:2]])
    fresh = engine_for(dense, max_batch_size=2).generate(
        [GenerationRequest(p, max_new_tokens=6, ignore_eos=True) for p in PROMPTS[:2]])
    assert [r.token_ids for r in again] == [r.token_ids for r in fresh]
    assert [r.logprobs for r in again] == [r.logprobs for r in fresh]


def test_logprobs_are_of_the_temperature_scaled_full_distribution(dense):
    """Per-row temperature and top_p in one batch; the recorded logprob ignores top-p truncation."""
    engine = engine_for(dense, seed=3)
    settings = [(0.7, 1.0), (1.3, 0.8), (0.0, 1.0), (1.0, 0.5)]
    requests = [
        GenerationRequest(p, max_new_tokens=10, temperature=t, top_p=q, ignore_eos=True)
        for p, (t, q) in zip(PROMPTS, settings)
    ]
    for req, r in zip(requests, engine.generate(requests)):
        ref = reference_logprobs(dense, req.prompt_ids, r.token_ids, req.temperature)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)
        assert all(lp <= 0 for lp in r.logprobs)
    greedy = engine.generate([requests[2]])[0]
    assert greedy.token_ids == naive_greedy(dense, PROMPTS[2], 10)


def test_requests_join_and_leave_mid_flight(dense):
    """Two slots, six requests of different lengths: queueing, slot reuse after retirement and
    submissions while others decode must not disturb any sequence."""
    engine = engine_for(dense, max_batch_size=2)
    lengths = [3, 9, 5, 7, 2, 6]
    prompts = PROMPTS + [TOK.encode("ab"), TOK.encode("return x")]
    first = {engine.submit(GenerationRequest(prompts[i], max_new_tokens=lengths[i], ignore_eos=True, tag=i)): i
             for i in range(2)}
    results = engine.step() + engine.step()
    later = {engine.submit(GenerationRequest(prompts[i], max_new_tokens=lengths[i], ignore_eos=True, tag=i)): i
             for i in range(2, 6)}
    while engine.has_work:
        results += engine.step()
    assert sorted(r.request_id for r in results) == sorted({**first, **later})
    for r in results:
        i = r.tag
        assert r.token_ids == naive_greedy(dense, prompts[i], lengths[i]), f"request {i}"
        assert len(r.logprobs) == len(r.versions) == lengths[i]


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_slots_stay_compact_as_requests_finish_out_of_order(name, dense, moe):
    """Four slots, eight requests whose lengths make them finish in a scrambled order. Each
    retirement leaves a hole that a later sequence is moved into (its KV cache, tokens and, for
    MoE, recorded experts move with it) and new requests queue in behind; the running sequences
    always occupy slots 0..n-1 (the cache is read as a view, never gathered), and every result
    still equals its own full-forward greedy run."""
    model = dense if name == "tiny" else moe
    engine = engine_for(model)
    lengths = [9, 2, 6, 3, 7, 1, 5, 4]
    prompts = PROMPTS + [TOK.encode(s) for s in ("ab", "return x", "while 1:", "z = [")]
    for i, n in enumerate(lengths):
        engine.submit(GenerationRequest(prompts[i], max_new_tokens=n, ignore_eos=True, tag=i))
    results = []
    while engine.has_work:
        results += engine.step()
        assert sorted(engine._running) == list(range(len(engine._running)))
    assert sorted(r.tag for r in results) == list(range(8))
    for r in results:
        assert r.token_ids == naive_greedy(model, r.prompt_ids, lengths[r.tag]), f"request {r.tag}"
        if name == "tiny-moe":
            with torch.inference_mode():
                _, full = model(torch.tensor([r.prompt_ids + r.token_ids[:-1]]), return_experts=True)
            expected = full[0, len(r.prompt_ids) - 1 :]
            assert torch.equal(torch.tensor(r.experts).sort(-1).values, expected.sort(-1).values)


def test_generate_leaves_other_requests_to_step(dense):
    engine = engine_for(dense)
    other = engine.submit(GenerationRequest(PROMPTS[0], max_new_tokens=20, ignore_eos=True))
    (mine,) = engine.generate([GenerationRequest(PROMPTS[1], max_new_tokens=3, ignore_eos=True)])
    assert mine.token_ids == naive_greedy(dense, PROMPTS[1], 3)
    results = []
    while engine.has_work:
        results += engine.step()
    assert [r.request_id for r in results] == [other]
    assert results[0].token_ids == naive_greedy(dense, PROMPTS[0], 20)


def test_finish_reasons(dense):
    prompt = PROMPTS[2]
    reference = naive_greedy(dense, prompt, 16)
    # eos: pretend the 5th greedy token is the end-of-sequence token.
    eos_tok = ByteTokenizer()
    eos_tok.eos_id = reference[4]
    stop_at = reference.index(reference[4]) + 1
    (r,) = engine_for(dense, eos_tok).generate([GenerationRequest(prompt, max_new_tokens=16)])
    assert (r.finish_reason, r.token_ids) == ("eos", reference[:stop_at])
    (r,) = engine_for(dense, eos_tok).generate([GenerationRequest(prompt, max_new_tokens=16, ignore_eos=True)])
    assert (r.finish_reason, r.token_ids) == ("length", reference)
    # stop string: text of greedy tokens 6..7; generation ends on the token completing it.
    stop = TOK.decode(reference[6:8])
    assert stop, "pick tokens that decode to text"
    cut = next(n for n in range(1, 17) if stop in TOK.decode(reference[:n]))
    (r,) = engine_for(dense).generate([GenerationRequest(prompt, max_new_tokens=16, ignore_eos=True, stop=[stop])])
    assert (r.finish_reason, r.token_ids) == ("stop", reference[:cut])
    assert r.text.endswith(stop)
    # engine default stop strings apply when the request gives none
    (r,) = engine_for(dense, stop=[stop]).generate([GenerationRequest(prompt, max_new_tokens=16, ignore_eos=True)])
    assert r.finish_reason == "stop"
    # slot full: max_seq_len caps prompt + completion
    engine = engine_for(dense, max_seq_len=len(prompt) + 3, max_new_tokens=2)
    (r,) = engine.generate([GenerationRequest(prompt, max_new_tokens=100, ignore_eos=True)])
    assert (r.finish_reason, r.token_ids) == ("length", reference[:3])


@pytest.mark.parametrize("recompute", [True, False])
def test_load_weights_mid_generation(dense, recompute):
    """Tokens before the swap carry version 0 and follow the old weights; those after carry
    version 1, none are dropped, and (with KV recompute) they are exactly the new weights'."""
    old, new = make_model("tiny"), make_model("tiny", seed=1)  # the engine overwrites `old`
    engine = engine_for(old, recompute_kv_on_reload=recompute)
    n = 12
    ids = [engine.submit(GenerationRequest(p, max_new_tokens=n, ignore_eos=True)) for p in PROMPTS[:3]]
    results = engine.step() + engine.step()  # prefill + 1 decode, then 1 decode: 3 tokens each
    assert not results
    engine.load_weights(new.state_dict() if recompute else new, version=1)
    assert engine.version == 1
    while engine.has_work:
        results += engine.step()
    assert sorted(r.request_id for r in results) == ids
    for r in sorted(results, key=lambda r: r.request_id):
        assert len(r.token_ids) == len(r.logprobs) == n
        assert r.versions == [0] * 3 + [1] * (n - 3)
        assert r.token_ids[:3] == naive_greedy(dense, r.prompt_ids, 3)
        if recompute:
            context = r.prompt_ids + r.token_ids[:3]
            assert r.token_ids[3:] == naive_greedy(new, context, n - 3)
            ref = reference_logprobs(new, context, r.token_ids[3:], 0.0)
            torch.testing.assert_close(torch.tensor(r.logprobs[3:]), ref, atol=1e-4, rtol=0)


def test_moe_records_experts_of_the_position_each_token_was_sampled_from(moe):
    cfg = moe.config
    engine = engine_for(moe)
    n = 8
    results = engine.generate([GenerationRequest(p, max_new_tokens=n, ignore_eos=True) for p in PROMPTS])
    for r in results:
        assert r.token_ids == naive_greedy(moe, r.prompt_ids, n)
        experts = torch.tensor(r.experts)
        assert experts.shape == (n, cfg.num_hidden_layers, cfg.num_experts_per_tok)
        with torch.inference_mode():
            _, full = moe(torch.tensor([r.prompt_ids + r.token_ids[:-1]]), return_experts=True)
        expected = full[0, len(r.prompt_ids) - 1 :]
        # top-k order may differ on a float near-tie between chosen experts; the set may not
        assert torch.equal(experts.sort(-1).values, expected.sort(-1).values)


def test_seeded_sampling_is_reproducible(dense):
    def run(seed):
        engine = engine_for(dense, temperature=1.0, seed=seed)
        reqs = [GenerationRequest(p, max_new_tokens=16, ignore_eos=True) for p in PROMPTS]
        return [r.token_ids for r in engine.generate(reqs)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_a_seeded_request_samples_the_same_alone_or_batched(dense):
    """A seeded request draws from its own stream: the same tokens alone in a fresh engine as
    batched with others in an engine that sampled before (so an RL episode's sample does not
    depend on which worker ran it, or beside what)."""
    def req(seed=11):
        return GenerationRequest(PROMPTS[0], max_new_tokens=16, ignore_eos=True, seed=seed)

    (alone,) = engine_for(dense, temperature=1.0).generate([req()])
    busy = engine_for(dense, temperature=1.0, seed=3)
    busy.generate([GenerationRequest(p, max_new_tokens=5, ignore_eos=True) for p in PROMPTS])
    others = [GenerationRequest(p, max_new_tokens=16, ignore_eos=True) for p in PROMPTS[1:3]]
    batched = busy.generate([*others, req()])[-1]
    assert (alone.token_ids, alone.logprobs) == (batched.token_ids, batched.logprobs)
    (reseeded,) = engine_for(dense, temperature=1.0).generate([req(seed=12)])
    assert reseeded.token_ids != alone.token_ids


def test_sample_nucleus_and_greedy_rows():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(3, 4).clone()
    temperature = torch.tensor([1.0, 1.0, 0.0])
    top_p = torch.tensor([0.7, 0.45, 1.0])
    gen = torch.Generator().manual_seed(0)
    seen = [set(), set(), set()]
    for _ in range(200):
        tokens, logprobs = sample(logits, temperature, top_p, torch.rand(3, generator=gen))
        for row, t in enumerate(tokens.tolist()):
            seen[row].add(t)
        # full-distribution logprob, whatever the nucleus
        torch.testing.assert_close(logprobs, probs.log()[tokens])
    assert seen == [{0, 1}, {0}, {0}]
    # the draw follows the distribution: 4000 rows at once, frequencies within ~4 sigma
    n = 4000
    tokens, _ = sample(probs.log().expand(n, 4), torch.ones(n), torch.ones(n), torch.rand(n, generator=gen))
    freq = torch.bincount(tokens, minlength=4) / n
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)
    # the all-greedy shortcut is sample() at T = 0, tokens and logprobs alike
    scores = torch.randn(5, 11, generator=gen)
    sampled = sample(scores, torch.zeros(5), torch.ones(5), torch.rand(5, generator=gen))
    assert all(torch.equal(a, b) for a, b in zip(greedy(scores), sampled))
    # a token of zero probability is never drawn, even at the top of the CDF
    zero_tail = torch.tensor([[0.0, 1.0, -math.inf]]).expand(n, 3)
    top = torch.nextafter(torch.ones(1), torch.zeros(1))  # the largest uniform below 1
    tokens, _ = sample(zero_tail, torch.ones(n), torch.ones(n), torch.cat([torch.rand(n - 1, generator=gen), top]))
    assert set(tokens.tolist()) == {0, 1}


def test_errors_name_what_to_fix(dense):
    engine = engine_for(dense, max_seq_len=16, max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        GenerationRequest([])
    with pytest.raises(ValueError, match="temperature"):
        GenerationRequest([1], temperature=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        GenerationRequest([1], temperature=math.nan)
    with pytest.raises(ValueError, match="top_p"):
        GenerationRequest([1], top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationRequest([1], max_new_tokens=0)
    with pytest.raises(ValueError, match="at most 15"):
        engine.submit(GenerationRequest([1] * 16))
    with pytest.raises(ValueError, match=r"\[0, 260\)"):
        engine.submit(GenerationRequest([1, 999]))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine_for(dense, max_seq_len=dense.config.max_position_embeddings + 1)
    assert not engine.has_work
    (r,) = engine.generate([GenerationRequest([1] * 15)])  # the longest prompt that fits
    assert len(r.token_ids) == 1 and r.finish_reason in ("length", "eos")


def run_conversations(engine, turns: int, seed: int = 0):
    """Four multi-turn conversations at their own pace: each turn's prompt is the last prompt +
    its completion + an "observation"; returns every result by (conversation, turn)."""
    rng = __import__("random").Random(seed)
    prompts = {c: PROMPTS[c] for c in range(4)}
    turn = dict.fromkeys(prompts, 0)
    results = {}

    def submit(c):
        engine.submit(GenerationRequest(prompts[c], max_new_tokens=rng.randint(2, 6),
                                        ignore_eos=True, tag=(c, turn[c])))

    for c in prompts:
        submit(c)
    while engine.has_work:
        for r in engine.step():
            c, t = r.tag
            results[r.tag] = r
            if t + 1 < turns:
                turn[c] = t + 1
                prompts[c] = r.prompt_ids + r.token_ids + TOK.encode(f"<obs {c}.{t}>")
                submit(c)
    return results


@pytest.mark.parametrize("slots", [8, 5, 3])
@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_prefix_cache_changes_nothing_but_the_prefill(name, slots, dense, moe):
    """Multi-turn conversations with the prefix cache give bit for bit the tokens, logprobs and
    (MoE) experts of the engine without it, at temperature 1, whether parked slots are plenty
    (8), scarce (5) or displaced by every admission (3); with room, most prompt tokens are
    served from the cache."""
    model = dense if name == "tiny" else moe
    kwargs = {"max_batch_size": slots, "max_seq_len": 128, "temperature": 1.0, "seed": 5}
    on, off = engine_for(model, **kwargs), engine_for(model, prefix_cache=False, **kwargs)
    with_cache, without = run_conversations(on, 5), run_conversations(off, 5)
    assert with_cache.keys() == without.keys() and len(with_cache) == 20
    for key, r in with_cache.items():
        ref = without[key]
        assert (r.prompt_ids, r.token_ids, r.logprobs) == (ref.prompt_ids, ref.token_ids, ref.logprobs), key
        assert (r.experts, r.prompt_experts) == (ref.experts, ref.prompt_experts), key
    assert off.cached_tokens == 0
    assert on.prefill_tokens + on.cached_tokens == off.prefill_tokens
    if slots == 8:
        assert on.cached_tokens > 2 * on.prefill_tokens


def test_prefix_cache_is_dropped_on_weight_update(dense):
    """Parked keys/values are of the old weights: after load_weights the next turn is prefilled
    in full and equals a fresh engine's run under the new weights."""
    engine = engine_for(dense, max_batch_size=4)
    (first,) = engine.generate([GenerationRequest(PROMPTS[1], max_new_tokens=4, ignore_eos=True)])
    other = make_model("tiny", seed=1)
    engine.load_weights(other, version=1)
    follow = GenerationRequest(first.prompt_ids + first.token_ids + TOK.encode("ok"), max_new_tokens=5,
                               ignore_eos=True)
    before = engine.cached_tokens
    (again,) = engine.generate([follow])
    assert engine.cached_tokens == before
    assert again.token_ids == naive_greedy(other, follow.prompt_ids, 5)


@pytest.mark.parametrize("slots", [16, 5])
@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_shared_prompts_prefill_once_and_change_no_bit(name, slots, dense, moe):
    """GRPO-style waves (4 prompts x 4 seeded samples, shuffled, plus a 1-token prompt) give bit
    for bit the tokens, logprobs and (MoE) experts of the engine without share_prompts, whether
    a whole group fits in one admission (16 slots) or is cut across waves (5); with room, each
    prompt is prefilled once and its copies prefill their last token only."""
    model = dense if name == "tiny" else moe
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (9, 23, 23, 40)]
    prompts[2][-1] = (prompts[1][-1] + 1) % 250  # shares all but its last token with prompt 1
    order = torch.randperm(16, generator=g).tolist()
    requests = [GenerationRequest(prompts[i // 4], seed=100 + i, tag=i) for i in order]
    requests.append(GenerationRequest([7], seed=99, tag=99))
    kwargs = {"max_batch_size": slots, "max_seq_len": 96, "temperature": 1.0, "max_new_tokens": 12}
    results = {}
    for share in (True, False):
        engine = engine_for(model, share_prompts=share, prefix_cache=False, **kwargs)
        results[share] = ({r.tag: r for r in engine.generate(requests)}, engine)
    (on, engine_on), (off, engine_off) = results[True], results[False]
    assert on.keys() == off.keys() and len(on) == 17
    for tag, r in on.items():
        ref = off[tag]
        assert (r.token_ids, r.logprobs, r.versions) == (ref.token_ids, ref.logprobs, ref.versions), tag
        assert (r.experts, r.prompt_experts) == (ref.experts, ref.prompt_experts), tag
    assert engine_on.prefill_tokens + engine_on.cached_tokens == engine_off.prefill_tokens
    if slots == 16:
        assert engine_on.prefill_tokens == sum(len(p) for p in prompts) + 12 + 1

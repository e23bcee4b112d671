"""The "funcs" task family: determinism, the held-out split, the corpus, reference solutions."""

from tidal.families.funcs import FuncsConfig, build_corpus, canonical, evaluate, is_heldout, sample_tasks


def test_deterministic_from_seed():
    env = FuncsConfig()
    a = sample_tasks(env, 20, seed=3, heldout=False)
    b = sample_tasks(env, 20, seed=3, heldout=False)
    c = sample_tasks(env, 20, seed=4, heldout=False)
    assert a == b
    assert a != c


def test_heldout_disjoint_from_training_by_construction():
    env = FuncsConfig()
    held = sample_tasks(env, 200, seed=0, heldout=True)
    train = sample_tasks(env, 5000, seed=1, heldout=False)
    assert len({canonical(t.spec) for t in held}) == 200
    assert not {t.spec for t in held} & {t.spec for t in train}
    assert all(is_heldout(t.spec, env.heldout_buckets) for t in held)


def test_levels_respected():
    env = FuncsConfig(min_level=2, max_level=2)
    assert {t.level for t in sample_tasks(env, 50, seed=0, heldout=False)} == {2}


def test_reference_solution_matches_hidden_tests():
    env = FuncsConfig()
    for task in sample_tasks(env, 100, seed=5, heldout=False):
        ns: dict = {}
        exec(task.prompt + task.reference_solution, ns)
        assert all(ns["f"](x) == y == evaluate(task.spec, x) for x, y in task.tests)


def wrong_documents(docs: list[str]) -> int:
    """Documents whose own code disagrees with the example in their prompt."""
    wrong = 0
    for d in docs:
        ns: dict = {}
        exec(d, ns)
        examples = d.split("\n")[1][len("# Examples: "):].split(", ")  # "f(a) == b, ..."
        if any(str(ns["f"](int(p.split("(")[1].split(")")[0]))) != p.split("== ")[1] for p in examples):
            wrong += 1
    return wrong


def test_corpus_from_training_split_only_with_bugs():
    env = FuncsConfig()
    docs = build_corpus(env, 400, seed=0)
    assert len(docs) == 400
    held_prompts = {t.prompt.split("\n")[0] for t in sample_tasks(env, 300, seed=0, heldout=True)}
    assert not held_prompts & {d.split("\n")[0] for d in docs}
    assert 0.15 < wrong_documents(docs) / len(docs) < 0.7  # a realistic share of buggy solutions
    clean = build_corpus(FuncsConfig(corpus_bug_rate=0), 100, seed=0)
    assert wrong_documents(clean) == 0

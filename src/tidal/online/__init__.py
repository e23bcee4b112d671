"""Real-time RL: serve the policy over an OpenAI-compatible API, learn from users' feedback, and
promote each new version through a gate and a canary, with automatic rollback.

    tidal serve ──> api/ (FastAPI on uvicorn: /v1/models, /v1/completions, /v1/chat/completions,
                    /v1/feedback; bearer API keys, user and admin) ──> serving.py (the engine on its own thread, continuous
                    batching; the live version and a canary side by side)
                ──> store/ (SQLAlchemy: responses, feedback, the version registry; SQLite WAL or
                    PostgreSQL; group commit, every write durable before its ack)
    learner process ──> learner.py (feedback -> reward.py -> Trainer.step -> candidate)
                    ──> gate.py (held-out pass@1, behaviour guards) ──> canary.py (mSPRT)
                    ──> the registry: promote, or roll back bit-exact to the incumbent

records.py holds the typed records they pass; behaviour.py tells actions from the two known
reward hacks; config.py the ``[online]`` section with every default.
"""

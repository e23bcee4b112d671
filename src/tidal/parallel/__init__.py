"""Data-parallel sharding with PyTorch FSDP2 (process group, which modules are units, mixed
precision), used by the sharded RL trainer and by mid-training."""

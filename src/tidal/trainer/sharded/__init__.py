"""The FSDP2-sharded trainer (docs/scale.md): process group, sharding, the rank-local trainer,
distributed checkpoints and HF export, and the driver-side handle with the Trainer interface."""

"""Chat messages as a model reads them: chat templates (a checkpoint's own, or tidal's documented
plain template with its Hermes-style tool format), OpenAI function calling (tool schemas, tool
choice, parsing a reply's calls back), and rendering messages to token ids. Shared by the
harness's tool-speaking episodes, the rollout gateway and ``tidal serve``."""

"""The agents' option values, importable without their libraries (the command line's parsers use them)."""

SERVERS = ("auto", "vllm", "openai")  # OpenAI-compatible servers; openai: the common API only
PROMPT_FORMATS = ("chat", "text")  # how a runner without a tokenizer sends the conversation
BATCHING = ("static", "continuous")  # RolloutRunner: one generate call per tick, or slots refilled as turns end

"""Default system prompts, one per reward type: each tells the model the exact format its reward checks."""

THINK_ANSWER_TAGS_PROMPT = (
    "You are a careful problem solver. First reason about the problem inside <think> </think> tags, then "
    "give only the final answer inside <answer> </answer> tags, like this: "
    "<think> your reasoning </think><answer> final answer </answer>."
)

BOXED_PROMPT = "Solve the problem step by step. Write the final answer once, inside \\boxed{}."

"""Default system prompt for code tasks: it asks for exactly the format :func:`extract_code` looks for."""

CODE_SYSTEM_PROMPT = (
    "You are an expert Python programmer. Think about the problem briefly, then write a complete Python 3 "
    "program that reads its input from standard input and prints the answer to standard output, exactly in "
    "the format the problem asks for. Put the whole program in a single ```python code block at the end of "
    "your answer. Use only the standard library, and do not print anything besides the answer."
)

"""Datasets as JSONL rows ``{"id", "question", "answer"}`` and the paper's prompt.

The toy generator makes short addition word problems whose reference chain of thought adds
column by column: a tiny model learns it in minutes but its greedy decode is often wrong,
which is what RL needs to have something to improve."""

from __future__ import annotations

# The paper's prompt, as its GSM8K prompt example prints it (Appendix "Format Following"): the
# instruction on one line, a line break, then "User: QUESTION Assistant: " (the task prompt's
# trailing space after "Assistant:", Appendix B). docs/protocol.md compares it byte for byte.
PROMPT_PREAMBLE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first shows the complete reasoning process step by step, then "
    "provides the final answer in \\boxed{}. The assistant must always follow the format: "
    "'User: [question] Assistant: [detailed reasoning] The final answer is: \\boxed{[answer]}.'"
)


PROMPT_TEMPLATE = PROMPT_PREAMBLE.replace("{", "{{").replace("}", "}}") + "\nUser: {question} Assistant: "


# what every prompt starts with: the engine prefills it once per call (engine.cot.CotEngine)
PROMPT_HEAD = PROMPT_TEMPLATE.split("{question}")[0].replace("{{", "{").replace("}}", "}")


# Appendix C. The CoT stops when its (shadow) text ends with STOP_TEXT, trailing whitespace
# ignored (see engine.stoprule for why); then the engine feeds PREFILL_AFTER_STOP, or
# PREFILL_AT_LIMIT if the CoT reached its token limit without stopping.
STOP_TEXT = "The final answer is:"


PREFILL_AFTER_STOP = " \\boxed{"


PREFILL_AT_LIMIT = "The final answer is: \\boxed{"
# decode steps the prefill takes at most (PREFILL_AT_LIMIT's tokens, with room for a tokenizer that splits
# it finely): what the memory plan (sizing.plan) and the rates of a step (rates.throughput) count between
# the CoT budget and the answer budget
PREFILL_TOKENS = 16


def format_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question)

"""The paper's reward (math-verify on the boxed answer: 100 / 10 / 0) and the pool of worker
processes that grades with a hard time-out. ``softtokens.reward.reward`` is the public name."""

from softtokens.reward.grader import reward

__all__ = ["reward"]

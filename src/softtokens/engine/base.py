"""What every CoT engine knows of its tokenizer, shared by the fast engine (cot.py) and the
reference loop (reference.py): the prefill queues, the end-of-answer ids, the stop rule's
token pieces and each row's randomness. One home, so the two engines the tests compare cannot
differ in anything but the loop itself."""

from __future__ import annotations

import torch

from softtokens.data.prompt import PREFILL_AFTER_STOP, PREFILL_AT_LIMIT, STOP_TEXT
from softtokens.engine.rollout import Rollout
from softtokens.engine.settings import EMBEDDING, CotSetting, Placement
from softtokens.engine.stoprule import StopAutomaton
from softtokens.model.head import check_plain_output_head


class CotEngineBase:
    """The interface the trainer, the evaluation and the benchmarks use: ``generate`` a batch
    of rollouts from prompts, with one seed per row."""

    def __init__(self, model, tokenizer):
        check_plain_output_head(model)
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_rows = len(tokenizer)  # rows of E beyond the tokenizer (Qwen pads E) are masked
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = {tokenizer.eos_token_id} | set(_as_list(getattr(model.generation_config, "eos_token_id", None)))
        self.eos_ids.discard(None)
        self.prefill_stop = tokenizer(PREFILL_AFTER_STOP, add_special_tokens=False)["input_ids"]
        self.prefill_limit = tokenizer(PREFILL_AT_LIMIT, add_special_tokens=False)["input_ids"]
        self.pieces = tokenizer.batch_decode([[i] for i in range(self.vocab_rows)])
        self.stop_rule = StopAutomaton(STOP_TEXT, self.pieces)

    @property
    def embedding(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight[: self.vocab_rows]

    @property
    def max_prefill(self) -> int:
        return max(len(self.prefill_stop), len(self.prefill_limit))

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(prompts, padding=True, return_tensors="pt")
        dev = self.model.device
        return enc["input_ids"].to(dev), enc["attention_mask"].to(dev)

    def row_randomness(self, seeds: list[int], cot_max: int, answer_max: int):
        """Each row's uniforms (CoT, answer), from a generator seeded by the row's seed (a function
        of run seed, step, prompt and sample): a row's result does not depend on the rows it is
        batched with. Its Gaussian noise is counter noise keyed by the same seed (noise.py)."""
        dev = self.model.device
        u_cot, u_ans = [], []
        for seed in seeds:
            g = torch.Generator(device=dev).manual_seed(int(seed))
            u_cot.append(torch.rand(cot_max, generator=g, device=dev))
            u_ans.append(torch.rand(answer_max, generator=g, device=dev))
        return torch.stack(u_cot), torch.stack(u_ans)

    def generate(self, prompts: list[str], setting: CotSetting, sigma: float, seeds: list[int],
                 cot_max_tokens: int, answer_max_tokens: int, answer_temperature: float = 0.0,
                 placement: Placement = EMBEDDING) -> Rollout:
        raise NotImplementedError


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple, set)) else [x]

"""hf_causal_lm: a Hugging Face causal LM built from a transformers config, trained from scratch.

    task:
      name: hf_causal_lm
      config: {model_type: llama, hidden_size: 64, num_hidden_layers: 2, ...}
      data: PATH            # as tinylm: text, uint16 token files, or the embedded corpus

The model is `AutoModelForCausalLM.from_config` of `AutoConfig.for_model(model_type, **config)`:
no download, any architecture transformers ships. Its vocabulary is the corpus's (the config's
`vocab_size` when given must hold it) and its positions cover the context. The token sources,
micro-batches and held-out evaluation are tinylm's (`TinyLMTask`); Chinchilla counts the
non-embedding parameters (`num_parameters(exclude_embeddings=True)`). Needs the `hf` extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from schedule_search.core.config import STRICT, ConfigError, PositiveInt, parse
from schedule_search.tasks.protocol import Microbatch
from schedule_search.tasks.tinylm import TinyLMConfig, TinyLMTask

__all__ = ["HFCausalLMConfig", "HFCausalLMTask", "build"]


@dataclass
class HFCausalLMConfig:
    """`config`: the transformers config's keys (`model_type` names the architecture); the
    data keys mean what they mean for tinylm."""

    __pydantic_config__ = STRICT

    config: dict[str, Any] = field(default_factory=lambda: {"model_type": "llama"})
    context: PositiveInt = 64
    batch: PositiveInt = 16
    data: str | None = None
    vocab_size: PositiveInt | None = None
    max_bytes: PositiveInt = 4_000_000
    eval_batches: PositiveInt = 16


def model_config(options: Mapping[str, Any], vocab_size: int, context: int, source: str) -> Any:
    """The transformers config `options` name, refused in one line on an unknown
    architecture, an unknown key (transformers would keep a typo as a silent attribute), or a
    vocabulary or position count too small for the data."""
    try:
        from transformers import AutoConfig
    except ModuleNotFoundError:
        raise ConfigError(
            f"{source}: task.name: hf_causal_lm needs transformers "
            '(pip install "schedule-search[hf]")'
        ) from None
    options = dict(options)
    model_type = options.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ConfigError(f"{source}: task.config.model_type: expected an architecture, e.g. llama")
    try:
        known = AutoConfig.for_model(model_type).to_dict()
    except ValueError:
        raise ConfigError(
            f"{source}: task.config.model_type: transformers has no {model_type!r} architecture"
        ) from None
    for key in options:
        if key not in known:
            raise ConfigError(f"{source}: task.config.{key}: not a key of a {model_type} config")
    options.setdefault("vocab_size", vocab_size)
    options.setdefault("max_position_embeddings", context)
    if int(options["vocab_size"]) < vocab_size:
        raise ConfigError(
            f"{source}: task.config.vocab_size: {options['vocab_size']} cannot hold the data's "
            f"{vocab_size} token ids"
        )
    if "max_position_embeddings" in known and int(options["max_position_embeddings"]) < context:
        raise ConfigError(
            f"{source}: task.config.max_position_embeddings: {options['max_position_embeddings']}"
            f" is shorter than the context ({context})"
        )
    try:
        return AutoConfig.for_model(model_type, **options)
    except Exception as err:  # transformers' validators raise their own (multi-line) errors
        reason = str(err).strip().splitlines()[-1].strip()
        raise ConfigError(f"{source}: task.config: {model_type} refused it: {reason}") from None


class HFCausalLMTask(TinyLMTask):
    """tinylm's data and evaluation around a transformers model."""

    def __init__(self, config: HFCausalLMConfig, seed: int, source: str) -> None:
        data = TinyLMConfig(
            context=config.context,
            batch=config.batch,
            data=config.data,
            vocab_size=config.vocab_size,
            max_bytes=config.max_bytes,
            eval_batches=config.eval_batches,
        )
        super().__init__(data, seed, source)
        self.model_config = model_config(
            config.config, self.corpus.vocab_size, config.context, source
        )

    def build_model(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(self.seed)
        return AutoModelForCausalLM.from_config(self.model_config)

    def chinchilla_params(self, model: torch.nn.Module) -> int:
        return int(model.num_parameters(exclude_embeddings=True))  # type: ignore[operator]

    def loss_sum(self, model: torch.nn.Module, batch: Microbatch) -> torch.Tensor:
        rows = batch.data.to(next(model.parameters()).device, non_blocking=True)
        logits = model(input_ids=rows[:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten(), reduction="sum")


def build(options: Mapping[str, Any], seed: int, source: str = "task") -> HFCausalLMTask:
    return HFCausalLMTask(parse(HFCausalLMConfig, options, source, "task"), seed, source)

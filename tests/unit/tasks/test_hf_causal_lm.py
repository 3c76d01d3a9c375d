"""The `hf_causal_lm` task: a real transformers model built from a config (no download), on
tinylm's token sources, its loss and evaluation checked against transformers' own loss, and
every bad config a one-line error."""

import pytest
import torch
from transformers import LlamaForCausalLM

from schedule_search.core.config import ConfigError
from schedule_search.tasks.registry import build_task
from schedule_search.tasks.tinylm import TinyLMTask

LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def task(**changes):
    spec = {"name": "hf_causal_lm", "config": LLAMA, "context": 16, "batch": 4, "max_bytes": 50_000}
    return build_task(spec | changes, seed=3)


def test_a_llama_from_its_config_on_the_embedded_corpus():
    hf, tiny = (
        task(),
        build_task({"name": "tinylm", "context": 16, "batch": 4, "max_bytes": 50_000}, seed=3),
    )
    model = hf.build_model()
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.vocab_size == hf.corpus.vocab_size == 256
    assert model.config.max_position_embeddings == 16
    # Chinchilla on the non-embedding parameters: all but the token embedding.
    embedding = model.get_input_embeddings().weight.numel()
    assert hf.chinchilla_params(model) == sum(p.numel() for p in model.parameters()) - embedding
    # The same token stream and micro-batches as tinylm.
    assert torch.equal(hf.microbatch(5, 1, 2).data, tiny.microbatch(5, 1, 2).data)
    assert isinstance(hf, TinyLMTask) and hf.tokens_per_microbatch == 64

    batch = hf.microbatch(0, 0, 1)
    rows = batch.data
    with torch.no_grad():
        reference = model(input_ids=rows, labels=rows).loss  # transformers shifts the labels
        ours = hf.loss_sum(model, batch)
    assert float(ours) / batch.tokens == pytest.approx(float(reference), rel=1e-5)
    assert hf.evaluate(model) == hf.evaluate(model) and 4.0 < hf.evaluate(model) < 7.0
    assert torch.equal(next(task().build_model().parameters()), next(model.parameters()))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"config": {"model_type": "no_such_model"}},
            "task.config.model_type: transformers has no",
        ),
        ({"config": {"hidden_size": 32}}, "task.config.model_type: expected an architecture"),
        (
            {"config": LLAMA | {"hiden_size": 32}},
            "task.config.hiden_size: not a key of a llama config",
        ),
        ({"config": LLAMA | {"vocab_size": 100}}, "task.config.vocab_size: 100 cannot hold"),
        ({"config": LLAMA | {"max_position_embeddings": 8}}, "shorter than the context"),
        ({"config": LLAMA | {"num_attention_heads": 5}}, "task.config: llama refused it"),
        ({"conf": LLAMA}, "conf"),
    ],
)
def test_a_bad_config_is_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as error:
        task(**changes)
    assert "\n" not in str(error.value)

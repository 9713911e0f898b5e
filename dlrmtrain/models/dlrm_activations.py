"""DLRM v1's and DCNv2's activations on one rank (models/activation_memory.py), by formula:
each tensor models/dlrm.py's forward keeps for the backward, per sample.

`a` is the bytes of what runs under autocast (precision.py: the MLPs and the interaction);
the interaction's input is fp32 in both modes (the bottom MLP's output meets the fp32 pooled
rows and `cat` promotes), so the dot interaction keeps it as two bf16 copies (bmm's operands)
or one fp32 tensor, 4 bytes a value either way, and the cross net keeps x0 in fp32 (with a
bf16 copy for its first layer under bf16); the logit layer runs in fp32 (a fp32 copy of
its input under bf16). tests/models/test_activation_memory.py holds the formula to the bytes
torch.autograd.graph.saved_tensors_hooks sees.
"""

from __future__ import annotations

from dlrmtrain.config.schema import ModelConfig
from dlrmtrain.models.activation_memory import (
    BF16, FP32, INT64, ActivationMemory, ActivationPart, activation_bytes)


def _mlp_per_sample(in_dim: int, widths: list[int], a: int) -> int:
    """A torchrec MLP of Linear + ReLU layers: each Linear's input and the last ReLU's output."""
    return a * (in_dim + sum(widths))


def dlrm_activation_memory(m: ModelConfig, num_dense: int, num_tables: int, batch: int,
                           precision: str, cross_net: bool, dense_parameters: int) -> ActivationMemory:
    """A training step's activations at `batch` samples: `num_tables` pooled rows of
    m.embedding_dim per sample, the dot interaction (`cross_net` False) or DCNv2's cross net."""
    a, d = activation_bytes(precision), m.embedding_dim
    features = num_tables + 1  # the bottom MLP's row beside the pooled rows
    bottom = _mlp_per_sample(num_dense, list(m.bottom_mlp), a)
    top_hidden = list(m.top_mlp[:-1])
    fixed = 0
    if cross_net:  # x0 (fp32, and its bf16 copy under bf16); per layer V's output, the product's
        width = features * d  # other factor W·V·x_l + b (fp32), and x_{l+1} as its next reader keeps it
        interaction = (FP32 * width + (a * width if precision == "bf16" else 0)
                       + m.dcn_num_layers * (FP32 * width + a * m.dcn_low_rank_dim + a * width))
        top_in, top_in_bytes = width, 0  # x_L: counted with the last layer
        name = "the cross net"
    else:  # the rows for bmm, then [dense row, pairwise dots] into the top MLP
        pairs = features * (features - 1) // 2
        interaction, fixed = FP32 * features * d, 2 * INT64 * pairs  # the pairs' (row, column) index
        top_in, top_in_bytes = d + pairs, a * (d + pairs)
        name = "the dot interaction"
    top = (top_in_bytes + a * sum(top_hidden)
           + (FP32 * top_hidden[-1] if precision == "bf16" and top_hidden else 0)  # the fp32 logit layer's input
           + 2 * FP32)  # the logit and the loss
    widest = max([num_dense, *m.bottom_mlp, features * d, top_in, *top_hidden])
    parts = [ActivationPart("the bottom MLP", bottom * batch),
             ActivationPart(name, interaction * batch + fixed, held=FP32 * num_tables * d * batch,
                            holds="the interaction's input; the pooled rows until the forward's end",
                            advice="use a smaller run.global_batch_size"),
             ActivationPart("the top MLP", top * batch, transient=2 * FP32 * widest * batch,
                            advice="use a smaller run.global_batch_size")]
    if precision == "bf16":
        parts.append(ActivationPart("the bf16 copy of the weights", BF16 * dense_parameters))
    return ActivationMemory(tuple(parts), f"local batch {batch:,}, {precision}")

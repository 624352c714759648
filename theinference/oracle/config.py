"""Model shapes, inferred from a checkpoint's tensors rather than trusted from a config file."""

from dataclasses import dataclass

HEAD_DIM = 64  # every GPT-2 size (124M..1.5B) uses 64-wide heads, so n_head = n_embd // 64


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    n_embd: int
    vocab_size: int
    n_ctx: int

    @property
    def n_head(self) -> int:
        return self.n_embd // HEAD_DIM


GPT2_124M = ModelConfig(n_layer=12, n_embd=768, vocab_size=50257, n_ctx=1024)


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 checkpoint holds, in Hugging Face names (Conv1D is [in, out])."""
    d, f = c.n_embd, 4 * c.n_embd
    shapes = {
        "wte.weight": (c.vocab_size, d),
        "wpe.weight": (c.n_ctx, d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    per_layer = {
        "ln_1.weight": (d,),
        "ln_1.bias": (d,),
        "attn.c_attn.weight": (d, 3 * d),
        "attn.c_attn.bias": (3 * d,),
        "attn.c_proj.weight": (d, d),
        "attn.c_proj.bias": (d,),
        "ln_2.weight": (d,),
        "ln_2.bias": (d,),
        "mlp.c_fc.weight": (d, f),
        "mlp.c_fc.bias": (f,),
        "mlp.c_proj.weight": (f, d),
        "mlp.c_proj.bias": (d,),
    }
    for i in range(c.n_layer):
        shapes.update({f"h.{i}.{k}": v for k, v in per_layer.items()})
    return shapes

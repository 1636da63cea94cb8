"""Reference rotary embedding, in the rotate-half (GPT-NeoX) layout that Llama-family HF models use.

The caller builds cos_sin_cache once per model ([max_position, rotary_dim], cos in the first half
and sin in the second), which is where llama3 frequency scaling is applied.
"""

import torch


def rotary_embedding_ref(
    positions: torch.Tensor,  # [num_tokens] int64
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, rotary_dim], float32
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)  # [num_tokens, rotary_dim // 2]
    cos = torch.cat([cos, cos], dim=-1)[:, None, :]
    sin = torch.cat([sin, sin], dim=-1)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        rot_dim = cos.shape[-1]
        x_rot, x_pass = x[..., :rot_dim].float(), x[..., rot_dim:]
        x1, x2 = x_rot.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        out = (x_rot * cos + rotated * sin).to(x.dtype)
        return torch.cat([out, x_pass], dim=-1)

    return rotate(query), rotate(key)

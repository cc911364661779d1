"""fp8 tokens as DeepEP's fp8 calls take and return them: e4m3fn values held
as their bytes in a uint8 tensor [T][H], with one float32 scale per 128
channels [T][H/128]. torch 1.13 has no float8 dtype; these are the casts a
caller needs to make such tokens and to read received ones, on any device.
"""

import torch

E4M3_MAX = 448.0  # the largest finite e4m3fn magnitude
BLOCK = 128  # channels per scale


def _e4m3_table() -> torch.Tensor:
    """The value of each of the 256 e4m3fn bytes: sign, 4 exponent bits
    (bias 7), 3 mantissa bits; exponent 0 is subnormal, S.1111.111 is NaN."""
    codes = torch.arange(256)
    exponent, mantissa = (codes >> 3) & 0xF, (codes & 7).double()
    magnitude = torch.where(exponent == 0, mantissa / 8 * 2.0 ** -6,
                            (1 + mantissa / 8) * torch.pow(2.0, exponent.double() - 7))
    values = torch.where(codes >= 128, -magnitude, magnitude).float()
    values[(codes & 0x7F) == 0x7F] = float('nan')
    return values


E4M3 = _e4m3_table()  # float32 [256]: the value each byte stands for


def to_e4m3_bytes(v: torch.Tensor) -> torch.Tensor:
    """float32 values -> e4m3fn bytes (uint8, same shape), round to nearest
    even, saturating at +-448."""
    finite = E4M3[:127].to(v.device)  # codes 0x00..0x7e: 0 to 448, increasing
    magnitude = v.abs().clamp(max=E4M3_MAX).contiguous()
    upper = torch.searchsorted(finite, magnitude).clamp(max=126)
    lower = (upper - 1).clamp(min=0)
    below, above = magnitude - finite[lower], finite[upper] - magnitude
    # On a tie the even code wins: its mantissa ends in 0.
    code = torch.where((above < below) | ((above == below) & (upper % 2 == 0)), upper, lower)
    return (code | ((v < 0).long() << 7)).to(torch.uint8)


def per_token_cast_to_fp8(x: torch.Tensor):
    """(e4m3 bytes [T][H], float32 scales [T][H/128]) of x [T][H], H a
    multiple of 128: each 128-channel block scaled so that its largest
    magnitude becomes 448 (DeepEP's per_token_cast_to_fp8)."""
    if x.dim() != 2 or x.size(1) % BLOCK != 0:
        raise ValueError(f"x must be [T][H] with H a multiple of {BLOCK}, got {tuple(x.shape)}")
    blocks = x.float().unflatten(1, (-1, BLOCK))
    amax = blocks.abs().amax(dim=2).clamp(min=1e-4)
    return to_e4m3_bytes(blocks * (E4M3_MAX / amax.unsqueeze(2))).flatten(1), amax / E4M3_MAX


def per_token_cast_back(x_fp8: torch.Tensor, x_scales: torch.Tensor) -> torch.Tensor:
    """float32 [T][H]: the values e4m3 bytes [T][H] and their scales
    [T][H/128] stand for."""
    values = E4M3.to(x_fp8.device)[x_fp8.long()].unflatten(1, (-1, BLOCK))
    return (values * x_scales.reshape(x_fp8.size(0), -1, 1)).flatten(1)

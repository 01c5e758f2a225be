"""StyleGAN (Karras et al. 2019, "A Style-Based Generator Architecture for GANs"), config F.

As NVlabs/stylegan's networks_stylegan.py (G_style, G_mapping, G_synthesis,
D_basic) and its FFHQ training setup: non-saturating logistic G loss, logistic
D loss with R1 (gamma 10), Adam (0, 0.99, 1e-8), lr 0.003 at 1024 (train.py's
G_lrate_dict and D_lrate_dict), and Gs, the moving average of G with
beta = 0.5 ** (batch / 10k images). The original grew progressively; this
trains the 1024x1024 network directly (the reference's 'fixed' structure:
only the last ToRGB and the first FromRGB exist).
"""

from models import workload as wl
from models.layers import depthwise
from models.stylegan.nets import log2_res, nf

# The trainer's pieces, re-exported: tests and callers reach them as stylegan.<name>.
from models.stylegan.train import Nets as Nets
from models.stylegan.train import adam as adam
from models.stylegan.train import d_step as d_step
from models.stylegan.train import ema_beta as ema_beta
from models.stylegan.train import g_step as g_step
from models.stylegan.train import trainer


def _conv(k, cin, cout, hw):
  return 2.0 * k * k * cin * cout * hw


def generator_flops(cfg):
  """Forward FLOPs per image: both mapping passes (mixing), convolutions, styles, blurs."""
  d, top = cfg['latent_size'], log2_res(cfg)
  flops = 2 * cfg['mapping_layers'] * 2.0 * d * d  # the mixing latent is mapped too
  style = lambda c: 2.0 * d * 2 * c
  flops += _conv(3, nf(cfg, 1), nf(cfg, 1), 16) + 2 * style(nf(cfg, 1))
  cin = nf(cfg, 1)
  for res in range(3, top + 1):
    c, hw = nf(cfg, res - 1), 4**res
    if 2**res >= cfg['fused_min_res']:
      flops += _conv(4, cin, c, hw // 4)  # the 4x4 kernel on the input grid
    else:
      flops += _conv(3, cin, c, hw)
    flops += 2.0 * 9 * c * hw + _conv(3, c, c, hw) + 2 * style(c)  # blur, conv1, two styles
    cin = c
  return flops + _conv(1, cin, 3, 4**top)


def discriminator_flops(cfg):
  """Forward FLOPs per image: FromRGB, convolutions, blurs, the dense head."""
  top = log2_res(cfg)
  flops = _conv(1, 3, nf(cfg, top - 1), 4**top)
  for res in range(top, 2, -1):
    c, cout, hw = nf(cfg, res - 1), nf(cfg, res - 2), 4**res
    flops += _conv(3, c, c, hw) + 2.0 * 9 * c * hw
    if 2**res >= cfg['fused_min_res']:
      flops += _conv(4, c, cout, hw // 4)
    else:
      flops += _conv(3, c, cout, hw)
  c = nf(cfg, 1)
  return flops + _conv(3, c + 1, c, 16) + 2.0 * 16 * c * nf(cfg, 0) + 2.0 * nf(cfg, 0)


def flops_per_example(cfg):
  """Training FLOPs per image of one D step plus one G step.

  With G and D the forward costs: the D step runs G forward (G_f), D on the
  fakes forward and backward (3 D_f), and the reals through D forward and
  input-gradient (2 D_f) then that whole graph backward (4 D_f) for R1; the
  G step is G forward and backward (3 G_f) and D forward and input-gradient
  (2 D_f). In all 4 G_f + 11 D_f.
  """
  return 4.0 * generator_flops(cfg) + 11.0 * discriminator_flops(cfg)


STYLEGAN_CONFIG = dict(
  resolution=1024,
  fmap_base=8192,
  fmap_max=512,
  latent_size=512,
  mapping_layers=8,
  mapping_lrmul=0.01,
  style_mixing_prob=0.9,
  mbstd_group_size=4,
  mbstd_features=1,
  fused_min_res=128,
  r1_gamma=10.0,
  lr=0.003,
  ema_kimg=10.0,
  dlatent_avg_beta=0.995,
  # How the blur's depthwise filter is computed (models/stylegan/layers.blur): shifted sums in
  # one XLA fusion ('shifts') or XLA's cuDNN grouped convolution ('cudnn'). On an H200 in bf16
  # at 8 images the shifted sums compile in a quarter of cuDNN's time (models/layers/depthwise.py)
  # and forecast 7% less memory, at 2.6% lower throughput.
  depthwise='shifts',
)
# 8x8 keeps one block of each kind (XLA's CPU compile time grows with the layer count);
# fused_min_res=8 runs the fused resampling convolutions the full size uses from 128 up.
STYLEGAN_TINY = dict(
  resolution=8, fmap_base=64, fmap_max=16, latent_size=16, mapping_layers=2, fused_min_res=8
)


def check(cfg):
  """A resolution of 2**r, r >= 3 (4x4 up in doublings), a feature map at every stage, and
  minibatch-stddev features that divide the last block's channels."""
  res = cfg['resolution']
  if res & (res - 1):
    return f'resolution ({res}) must be a power of 2'
  stages = [nf(cfg, s) for s in range(1, res.bit_length() - 1)]
  return wl.first(
    (min(stages) < 1, f'fmap_base ({cfg["fmap_base"]}) must be at least resolution / 2'),
    (
      stages[0] % cfg['mbstd_features'] != 0,
      f'mbstd_features ({cfg["mbstd_features"]}) must divide the 4x4 channels ({stages[0]})',
    ),
  )


STYLEGAN = wl.Workload(
  name='stylegan',
  description='StyleGAN v1 config F at 1024x1024: D step with R1 and EMA of G, then G step',
  unit='images',
  throughput_unit='images/s',
  config=STYLEGAN_CONFIG,
  tiny=STYLEGAN_TINY,
  trainer=trainer,
  flops_per_example=flops_per_example,
  default_precision='fp32',
  family='image',
  adversarial=True,
  # 2: the fused resampling convolutions compute over pixel phases (revision 1 ran them as
  # transposed and strided 4x4 convolutions, with the blur through cuDNN). 3: Gs averages G
  # before G's update, with the D step (2 averaged the updated G).
  revision=3,
  spec=dict(
    resolution=wl.Key(lo=8),
    mapping_layers=wl.NATURAL,
    mapping_lrmul=wl.Key(above=0),
    style_mixing_prob=wl.PROBABILITY,
    ema_kimg=wl.Key(above=0),
    dlatent_avg_beta=wl.PROBABILITY,
    depthwise=wl.Key(choices=depthwise.IMPLS),
  ),
  check=check,
)

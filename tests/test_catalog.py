"""The GPU catalog, the published 2020 tables, and the emulation flags (--gpu, --memory_gb)."""

import os
import subprocess
import sys

import pytest

from jaxbench import cli
from jaxbench.cards import catalog, emulation
from jaxbench.results import published

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_catalog_holds_the_cards_people_train_on():
  want = {
    'rtx_2060': 6,
    'rtx_2070': 8,
    'rtx_2080': 8,
    'gtx_1080_ti': 11,
    'rtx_2080_ti': 11,
    'titan_rtx': 24,
    'quadro_rtx_6000': 24,
    'quadro_rtx_8000': 48,
    'v100_16': 16,
    'v100_32': 32,
    'p100_16': 16,
    'k80': 12,
    't4': 16,
    'a10': 24,
    'l4': 24,
    'l40s': 48,
    'rtx_3090': 24,
    'rtx_4090': 24,
    'rtx_5090': 32,
    'a100_40': 40,
    'a100_80': 80,
    'h100_80': 80,
    'h200': 141,
    'b200': 180,
  }
  assert {g: catalog.get(g).memory_gb for g in want} == want
  assert 'DGX B200' in catalog.get('b200').note


def test_the_eight_2020_gpus_match_the_published_tables():
  rows = published.rows()
  assert [g.name for g in catalog.lambda2020()] == published.gpus()
  for r in rows:
    gpu = catalog.get(r.gpu)
    assert (gpu.display, gpu.memory_gb, gpu.price_usd_2020) == (
      r.display,
      r.memory_gb,
      r.price_usd_2020,
    )


def test_published_tables_are_carried_with_their_notes():
  assert len(published.rows()) == 12 * 8 and len(published.workloads()) == 12
  pub = published.lookup()
  assert pub[('pix2pixhd', 'rtx_2080_ti')].max_batch == 0
  assert pub[('conv_seq2seq', 'rtx_2080_ti')].max_batch == 3584
  # The swapped rows carry the precision of the run their figures came from: the row named
  # transformer_big holds ConvS2S's FP32 figures, the one named conv_seq2seq Transformer's FP16.
  assert pub[('transformer_big', 'titan_rtx')].precision == 'fp32'
  assert pub[('transformer_big', 'titan_rtx')].figures_of == 'conv_seq2seq'
  assert pub[('conv_seq2seq', 'titan_rtx')].precision == 'fp16'
  assert published.trained_precision()['transformer_big'] == 'fp16'
  assert pub[('transformer_big', 'rtx_2060')].swapped
  assert not pub[('bert_base', 'rtx_2060')].swapped
  assert 'swapped' in published.notes() and 'swapped' in published.SWAP_NOTE


@pytest.mark.parametrize(
  'kind, name',
  [
    ('NVIDIA H200', 'h200'),
    ('NVIDIA H100 80GB HBM3', 'h100_80'),
    ('NVIDIA A100 80GB PCIe', 'a100_80'),
    ('NVIDIA GeForce RTX 4090', 'rtx_4090'),
    ('Tesla V100 32GB', 'v100_32'),
    ('NVIDIA H100 PCIe', None),  # the kind names no memory: not told from other H100s
    ('NVIDIA A100-SXM4-40GB', None),
    ('', None),
  ],
)
def test_a_device_kind_names_its_catalog_card(kind, name):
  assert catalog.of_device(kind) == name


def test_cap_is_card_memory_less_the_overhead():
  assert catalog.CARD_OVERHEAD_BYTES == 768 * 2**20
  g = catalog.get('rtx_2080_ti')
  assert g.memory_bytes == 11 * 2**30
  assert g.cap_bytes == 11 * 2**30 - 768 * 2**20
  with pytest.raises(catalog.CatalogError, match='leaves nothing'):
    catalog.raw(0.5)


def test_memory_gb_counts_gb_of_1e9_bytes_less_the_overhead():
  """--memory_gb=16 is a card of 16e9 bytes; the "16 GB" V100 has 16 GiB = 17.18 GB."""
  card = catalog.raw(16)
  assert card.memory_bytes == 16 * 10**9 and card.cap_bytes == 16 * 10**9 - 768 * 2**20
  assert card.name == 'mem_16gb' and card.display == '16 GB card'
  assert card.cap_bytes < catalog.get('v100_16').cap_bytes
  # A catalog card given by its size in GB is that card.
  assert catalog.raw(11 * 2**30 / 1e9).cap_bytes == catalog.get('rtx_2080_ti').cap_bytes


def test_gpu_sets_resolve_in_order_without_duplicates():
  names = [g.name for g in catalog.resolve(['t4', 'lambda2020', 'rtx_2060'])]
  assert names == ['t4'] + published.gpus()
  with pytest.raises(catalog.CatalogError, match='valid GPUs: lambda2020'):
    catalog.resolve(['lambda2021'])


def _flags(**kw):
  """The command line's values with `kw` given."""
  return cli.Args(**kw)


def test_request_sets_the_backend_cap_from_the_card():
  req = emulation.request(_flags(gpu='t4'))
  assert req.kind == emulation.SINGLE and req.limit_gb == pytest.approx(
    (16 * 2**30 - 768 * 2**20) / 1e9
  )
  req = emulation.request(_flags(memory_gb=16.0))
  assert req.limit_gb == pytest.approx((16e9 - 768 * 2**20) / 1e9)
  assert emulation.request(_flags()).limit_gb is None
  assert emulation.request(_flags(gpus=('lambda2020',), predict=True)).limit_gb is None


@pytest.mark.parametrize(
  'kw, says',
  [
    (dict(gpu='t4', memory_limit_gb=3.0), '--gpu and --memory_limit_gb conflict'),
    (dict(gpu='t4', memory_gb=16.0), 'conflict'),
    (dict(gpus=('t4',)), 'give --store'),
    (dict(predict=True), '--predict needs'),
    (dict(store='x.jsonl', memory_gb=8.0), 'catalog GPUs'),
    (dict(store='x.jsonl', gpus=('t4',), precision='fp32'), 'use --precisions'),
    (dict(precisions=('fp32',), gpu='t4'), '--precisions is for sweeps'),
    # A predicting sweep's cells would each refuse it: the sweep refuses it first.
    (dict(store='x.jsonl', gpus=('t4',), predict=True, probe_autotune_level=0), 'compiles only'),
  ],
)
def test_request_refuses_conflicts(kw, says):
  with pytest.raises(ValueError, match=says):
    emulation.request(_flags(**kw))


def _main(*args):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run(
    [sys.executable, '-m', 'jaxbench.main', *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )


@pytest.mark.parametrize(
  'args, says',
  [
    (['--model=bert_base', '--gpu=rtx_9090'], "unknown GPU 'rtx_9090'; valid GPUs: rtx_2060, "),
    (['--model=bert_base', '--gpu=t4', '--memory_limit_gb=3'], 'conflict'),
    (['--model=bert_base', '--gpus=lambda2020,h300', '--predict'], 'h200, b200'),
    (['--model=bert_base', '--memory_gb=0.1'], 'leaves nothing'),
  ],
)
def test_bad_gpu_flags_are_one_line_and_status_2(args, says):
  r = _main(*args)
  assert r.returncode == 2, r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and says in lines[0], r.stderr

"""Top-k sampling in the rollout generator: only the k likeliest tokens are ever sampled."""

import torch

from training.rollouts.generation import HFBatchGenerator
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model


def test_top_k_samples_only_among_the_k_likeliest_tokens():
    tokenizer = build_char_tokenizer()
    generator = HFBatchGenerator(build_tiny_model(tokenizer, seed=0), tokenizer, top_k=3, seed=0)
    log_probs = torch.log_softmax(torch.randn(64, len(tokenizer), generator=torch.Generator().manual_seed(1)), -1)
    allowed = log_probs.topk(3, dim=-1).indices
    for _ in range(20):
        picked = generator._pick(log_probs)
        assert (allowed == picked[:, None]).any(-1).all()


def test_without_top_k_every_token_can_be_sampled():
    tokenizer = build_char_tokenizer()
    generator = HFBatchGenerator(build_tiny_model(tokenizer, seed=0), tokenizer, seed=0)
    log_probs = torch.full((4096, 8), -2.0794)  # uniform over 8 tokens
    assert len(set(generator._pick(log_probs).tolist())) == 8

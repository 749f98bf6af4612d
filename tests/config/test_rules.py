"""metric_for_best_model and KTO's sampling, judged per training type with the names each one logs (the metric
names were read from real runs: a tiny GRPO run with a held-out split, MiniLM embedding and ColBERT runs)."""

from __future__ import annotations

import pytest

from leap_finetune.config.rules import check_training_rules
from leap_finetune.errors import LeapError


@pytest.mark.parametrize(
    "training_type, metric, rewards, benchmarks",
    [
        ("grpo", "eval_reward", ("accuracy",), ()),
        ("grpo", "eval_rewards/accuracy/mean", ("accuracy",), ()),
        ("grpo", "rewards/judge/std", ("accuracy", "judge"), ()),
        ("grpo", "eval_completions/mean_length", (), ()),
        ("embedding", "eval_retrieval_cosine_ndcg@10", (), ()),
        ("embedding", "eval_benchmark_held-out-search_cosine_mrr@10", (), ("held-out-search",)),
        ("colbert", "eval_retrieval_maxsim_recall@1", (), ()),
        ("colbert", "eval_loss", (), ()),
        ("sft", "eval_mean_token_accuracy", (), ()),
    ],
)
def test_a_metric_the_evaluation_logs_is_accepted(training_type, metric, rewards, benchmarks):
    check_training_rules(
        training_type, {"metric_for_best_model": metric}, "c.yaml", rewards=rewards, benchmarks=benchmarks
    )


@pytest.mark.parametrize(
    "training_type, metric, rewards, benchmarks, fix",
    [
        ("grpo", "eval_rewards/format/mean", ("accuracy",), (), "eval_rewards/accuracy/mean"),
        ("grpo", "eval_accuracy", ("accuracy", "judge"), (), "eval_rewards/judge/mean"),
        ("embedding", "eval_ndcg@10", (), ("beir",), "use eval_retrieval_cosine_ndcg@10"),
        ("embedding", "eval_benchmark_other_cosine_ndcg@10", (), ("beir",), "eval_benchmark_beir_cosine_ndcg@10"),
        ("colbert", "eval_accuracy", (), (), "use eval_retrieval_maxsim_ndcg@10"),
        # names of the right shape that the evaluator does not log: another k, another score function
        ("embedding", "eval_retrieval_cosine_ndcg@5", (), (), "use eval_retrieval_cosine_ndcg@10"),
        ("colbert", "eval_retrieval_cosine_ndcg@10", (), (), "use eval_retrieval_maxsim_ndcg@10"),
    ],
)
def test_an_unknown_metric_names_the_ones_logged(training_type, metric, rewards, benchmarks, fix):
    with pytest.raises(LeapError) as raised:
        check_training_rules(
            training_type, {"metric_for_best_model": metric}, "c.yaml", rewards=rewards, benchmarks=benchmarks
        )
    assert f"which {training_type} evaluation does not log" in raised.value.message
    assert fix in raised.value.fix and "use one of: ," not in raised.value.fix


def test_kto_keeps_its_rows_in_order_unless_its_loss_has_no_kl():
    with pytest.raises(LeapError, match="breaks KTO's KL estimate"):
        check_training_rules("kto", {"train_sampling_strategy": "random"}, "c.yaml")
    check_training_rules("kto", {"train_sampling_strategy": "sequential"}, "c.yaml")
    check_training_rules("kto", {"train_sampling_strategy": "random", "loss_type": "apo_zero_unpaired"}, "c.yaml")
    with pytest.raises(LeapError) as raised:  # (the length samplers' message offers only what KTO then accepts)
        check_training_rules("kto", {"train_sampling_strategy": "group_by_length"}, "c.yaml")
    assert raised.value.fix.endswith("set it to sequential")

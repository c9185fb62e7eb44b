"""The broad corpus: the requests users send that the general corpus lacks.

The shipped drafters were trained on short single-turn requests (median 72 prompt tokens,
longest 394) and lose most of their acceptance on long inputs, translation of news-like text and
second turns (issue 49's diagnostic).  This module writes those requests from packaged text
(``specui.data.passages``):

* ``long_documents``: 500-2,000-token passages to summarise, question, extract from, or answer
  from as retrieved documents (several numbered passages, RAG style);
* ``long_code``: whole functions and classes of the standard library (50-220 lines) to
  explain, review, document or test;
* ``translations``: paragraphs and whole sections in eight languages to translate into English,
  in the forms people ask for it;
* ``second_turns``: a first request, the verifier's own answer, and a follow-up;
* ``casual``: everyday requests in the short, informal forms people type.

Rows are the general corpus's (``id``, ``prompt``, ``kind``, ``source``), plus ``messages`` for
multi-turn rows (``prompt`` is then the last user turn).  Every choice is seeded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from specui.data import passages as text

Row = dict[str, object]

# Prompt sizes in words (English: ~1.3 tokens a word), so that a long passage is 500-2,000 tokens.
LONG_WORDS = (380, 1500)

SUMMARIZE_LONG = (
    "Summarize the following document.\n\n{p}",
    "{p}\n\nSummarize the text above in one paragraph.",
    "Can you give me the key points of this? Use bullet points.\n\n{p}",
    "Here is a long article:\n\n{p}\n\nWrite a short summary for someone in a hurry.",
    "tl;dr please\n\n{p}",
    "Summarize this in three sentences:\n\n{p}",
)
QUESTION_LONG = (
    "{p}\n\nBased on the text above, what is {topic} and why does it matter?",
    "Read this and answer my question.\n\n{p}\n\nQuestion: what does the text say about {topic}?",
    "Document:\n{p}\n\nUsing only the document, explain {topic} to a beginner.",
    "{p}\n\nWhat are the most important things to remember about {topic} from this text?",
)
EXTRACT_LONG = (
    "Extract every command, file name and package name mentioned in this text.\n\n{p}",
    "{p}\n\nList the steps the text describes, as a numbered list.",
    "Make a glossary of the technical terms in the following text.\n\n{p}",
    "Write five quiz questions, with answers, about this text:\n\n{p}",
)
RAG = (
    "Answer the question using the search results below. Cite the results you use as [n].\n\n"
    "{docs}\n\nQuestion: {q}",
    "{docs}\n\nUsing the documents above, answer: {q}",
    "You are a helpful assistant. Here are some retrieved passages:\n\n{docs}\n\n"
    "User question: {q}\nAnswer briefly and say which passage supports your answer.",
)
RAG_QUESTIONS = (
    "What is {topic}?",
    "How do I use {topic}?",
    "What should I know about {topic}?",
    "Why would someone need {topic}?",
    "What problems can come up with {topic}, and how are they solved?",
)
CODE_LONG = (
    "Explain what this code does.\n\n```python\n{p}\n```",
    "```python\n{p}\n```\n\nCan you walk me through this code step by step?",
    "Review this Python code. Point out bugs, edge cases and possible improvements.\n\n"
    "```python\n{p}\n```",
    "Write unit tests with pytest for the functions below.\n\n```python\n{p}\n```",
    "Add type hints and docstrings to this code.\n\n```python\n{p}\n```",
    "```python\n{p}\n```\nwhat does this do? explain like I'm new to python",
    "Summarize the purpose of each function and class in this code.\n\n```python\n{p}\n```",
)
TRANSLATE = (
    "Translate this {lang} text into English:\n\n{p}",
    "Translate to English:\n{p}",
    "What does this mean in English?\n\n{p}",
    "Please translate the following {lang} passage into natural English.\n\n{p}",
    "{p}\n\nTranslate the above into English.",
    "I got this message in {lang}, can you translate it for me?\n\n{p}",
    "translate into english pls: {p}",
    "{lang} -> English:\n{p}",
)
FOLLOW_UPS = (
    "Can you make that shorter?",
    "Thanks! Can you explain the second point in more detail?",
    "Can you give me an example?",
    "Why?",
    "I don't understand. Can you explain it more simply?",
    "Now write it as a bulleted list.",
    "Is there anything important you left out?",
    "Can you summarize your answer in one sentence?",
    "What would be a good next step?",
    "Are you sure? Please double-check your answer.",
    "Rewrite that in a more formal tone.",
    "Great, now explain it to a ten-year-old.",
    "What are the pros and cons?",
    "Could you continue?",
    "Give me three alternatives.",
    "How would I do this in practice?",
    "Can you add a short conclusion?",
    "ok, and what about the opposite case?",
    "Translate your answer into Spanish.",
    "Turn this into a short email I can send to my team.",
)
CASUAL = (
    "how do i {task}",
    "whats the best way to {task}?",
    "I need to {task}. Any tips?",
    "Can you help me {task}?",
    "quick question: how to {task}",
    "Explain {topic} in simple terms.",
    "what is {topic}",
    "Tell me something interesting about {topic}.",
    "Write a short poem about {topic}.",
    "write a tweet about {topic}",
    "Give me 5 facts about {topic}",
    "Is {topic} worth learning about? Why?",
    "Write a short story where {topic} plays a part.",
    "Compare {topic} and {other}.",
    "{topic} vs {other} - which is better?",
    "Write an email to my manager asking to {task}.",
    "My friend says {topic} is overrated. What do you think?",
    "Make a to-do list to {task}.",
)
TASKS = (
    "learn to cook rice",
    "save money on groceries",
    "fix a slow laptop",
    "prepare for a job interview",
    "write a cover letter",
    "start running",
    "sleep better",
    "learn a new language",
    "plan a trip to Japan",
    "back up my photos",
    "organize my week",
    "make a budget",
    "clean a cast iron pan",
    "keep houseplants alive",
    "speak in public without getting nervous",
    "learn Python",
    "set up a home network",
    "write a resume",
    "get better at chess",
    "take better photos with my phone",
    "ask for a raise",
    "reduce screen time",
    "plan a birthday party",
    "study for exams",
    "learn to draw",
    "train my dog to sit",
    "negotiate rent",
    "make friends in a new city",
    "start a vegetable garden",
    "meal prep for the week",
    "write a wedding toast",
    "move to a new apartment",
    "stay focused while working from home",
    "learn to touch type",
    "make sourdough bread",
    "deal with a difficult coworker",
    "recycle electronics",
    "choose a laptop",
    "start a podcast",
    "teach my kids about money",
)
TOPICS = (
    "black holes",
    "the French Revolution",
    "photosynthesis",
    "climate change",
    "the stock market",
    "machine learning",
    "coffee",
    "the Roman Empire",
    "vaccines",
    "electric cars",
    "the internet",
    "volcanoes",
    "jazz",
    "the moon landing",
    "bees",
    "inflation",
    "meditation",
    "the Olympic Games",
    "DNA",
    "renewable energy",
    "chess",
    "the printing press",
    "sharks",
    "social media",
    "the human brain",
    "recycling",
    "the Great Wall of China",
    "cryptocurrency",
    "dinosaurs",
    "tea",
    "football",
    "the water cycle",
    "earthquakes",
    "remote work",
    "solar panels",
    "the Renaissance",
    "penguins",
    "video games",
    "sleep",
    "public transport",
)


def _row(source: str, i: int, kind: str, prompt: str, messages: list | None = None) -> Row:
    row: Row = {"id": f"{source}/{i}", "prompt": prompt, "kind": kind, "source": source}
    if messages is not None:
        row["messages"] = messages
    return row


def _join(paragraphs: Sequence[str], rng: random.Random, lo: int, hi: int) -> list[str]:
    """Runs of consecutive paragraphs of one document, each about ``lo``..``hi`` words (a target
    drawn per run), in order."""
    out, run, words = [], [], 0
    target = rng.randint(lo, hi)
    for p in paragraphs:
        run.append(p)
        words += text.size(p)
        if words >= target:
            out.append("\n\n".join(run))
            run, words, target = [], 0, rng.randint(lo, hi)
    return out


def _topic(passage: str, rng: random.Random) -> str:
    """Something the passage is about, for a question: a capitalised or technical term of its
    first sentences (a word with a dot, slash, dash or capital inside), else its first words."""
    words = [w.strip(".,;:()\"'«»") for w in passage.split()[:80]]
    terms = [
        w for w in words if len(w) > 3 and (any(c in w for c in "./-_") or w[1:] != w[1:].lower())
    ]
    if terms:
        return f'"{rng.choice(terms)}"'
    return "the main subject"


def long_documents(seed: int, n: int) -> list[Row]:
    """``n`` requests about long English documents: summaries, questions, extraction, and RAG
    over several numbered passages."""
    rng = random.Random(seed)
    docs = (
        text.debian_text_paragraphs("en")
        + text.handbook_paragraphs()
        + text.python_doc_paragraphs()
    )
    passages = [p for d in docs for p in _join(d, rng, *LONG_WORDS)]
    shorts = [p for d in docs for p in _join(d, rng, 60, 260)]
    rng.shuffle(passages)
    rng.shuffle(shorts)
    rows = []
    for i in range(n):
        kind = ("summarize", "rag", "extract", "rag-multi")[i % 4]
        if kind == "rag-multi":
            k = rng.randint(3, 6)
            picked = [shorts[(i * 7 + j) % len(shorts)] for j in range(k)]
            docs_text = "\n\n".join(f"[{j + 1}] {p}" for j, p in enumerate(picked))
            q = rng.choice(RAG_QUESTIONS).format(topic=_topic(rng.choice(picked), rng))
            rows.append(_row("long-rag", i, "rag", rng.choice(RAG).format(docs=docs_text, q=q)))
            continue
        p = passages[i % len(passages)]
        templates = {"summarize": SUMMARIZE_LONG, "rag": QUESTION_LONG, "extract": EXTRACT_LONG}
        prompt = rng.choice(templates[kind]).format(p=p, topic=_topic(p, rng))
        rows.append(_row(f"long-{kind}", i, kind, prompt))
    return rows


def long_code(seed: int, n: int) -> list[Row]:
    """``n`` requests about 50-220 lines of the standard library's code."""
    rng = random.Random(seed)
    chunks = [c for f in text.stdlib_files() for c in text.code_chunks(f)]
    rng.shuffle(chunks)
    return [
        _row("long-code", i, "code", rng.choice(CODE_LONG).format(p=chunks[i % len(chunks)]))
        for i in range(min(n, len(chunks)))
    ]


def translations(seed: int, n: int) -> list[Row]:
    """``n`` translation requests into English, about as many in each of nine languages:
    documentation (a paragraph to a whole section) and everyday text (anecdotes, jokes, proverbs,
    poems) where the language has some."""
    rng = random.Random(seed)
    everyday = {**text.FORTUNE_LANGS, "es": "Spanish", "it": "Italian"}
    langs = {**text.DEBIAN_TEXT_LANGS}
    per_lang = -(-n // len(langs))
    pool: list[tuple[str, str, str]] = []  # (source, language, passage)
    for code, lang in langs.items():
        mine = []
        for d in text.debian_text_paragraphs(code):
            # Mostly a paragraph or a few; one in eight a whole section (up to ~900 words).
            long = rng.random() < 0.125
            mine += [
                (f"debian-{code}", lang, p)
                for p in _join(d, rng, *((300, 900) if long else (15, 200)))
            ]
        fortune_code = next((c for c, name in everyday.items() if name == lang), None)
        if fortune_code is not None:
            entries = text.fortune_entries(fortune_code)
            rng.shuffle(entries)
            # Everyday text fills what the documentation leaves, a third of the language at least.
            room = max(per_lang // 3, per_lang - len(mine))
            mine += [(f"fortunes-{fortune_code}", lang, e) for e in entries[:room]]
        rng.shuffle(mine)
        pool += mine[:per_lang]
    rng.shuffle(pool)
    rows = []
    for i, (source, lang, p) in enumerate(pool[:n]):
        prompt = rng.choice(TRANSLATE).format(lang=lang, p=p)
        rows.append(_row(f"translate-{source}", i, "translate", prompt))
    return rows


def second_turns(firsts: Sequence[tuple[str, str]], seed: int) -> list[Row]:
    """A follow-up to each ``(first request, the verifier's answer)``: the chat so far and a
    second user turn, as ``messages``."""
    rng = random.Random(seed)
    rows = []
    for i, (request, answer) in enumerate(firsts):
        follow = rng.choice(FOLLOW_UPS)
        messages = [
            {"role": "user", "content": request},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": follow},
        ]
        rows.append(_row("second-turn", i, "chat", follow, messages))
    return rows


def casual(seed: int, n: int) -> list[Row]:
    """``n`` everyday requests in the short, informal forms people type."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topic, other = rng.sample(TOPICS, 2)
        prompt = rng.choice(CASUAL).format(task=rng.choice(TASKS), topic=topic, other=other)
        rows.append(_row("casual", i, "chat", prompt))
    return rows

"""Packaged text to build requests from: documentation in nine languages, code, quotations.

Every source is a Debian package or the Python standard library, so the corpus can be rebuilt
on a machine with no network beyond the package registries, and each licence is recorded in
``data/corpus/README.md``:

* the Debian Reference (``debian-reference-{en,de,fr,es,it,ja,pt,zh-cn}``, GPL-2+) and the
  Debian FAQ (``debian-faq``, ``debian-faq-{de,fr,it,ja,nl,pt,ru,zh-cn}``, GPL-2+): plain text;
* the Debian Administrator's Handbook (``debian-handbook``, GPL-2+ / CC-BY-SA-3.0), English
  (its other language folders hold English text in this release);
* the Python documentation's reST sources (``python3-doc``, PSF licence);
* Debian's fortunes in German, Chinese and Russian (``fortunes-de``, ``fortunes-zh``,
  ``fortunes-ru``): anecdotes, jokes, poems, everyday text;
* the Python standard library's own source files (PSF licence), for long code.

Each reader returns plain strings; the request templates live in ``specui.data.broad``.
"""

from __future__ import annotations

import gzip
import html
import re
import sysconfig
from pathlib import Path

from specui.data.corpus import FORTUNES, PY_DOCS, rst_paragraphs
from specui.errors import SpecUIError

REFERENCE = Path("/usr/share/debian-reference")
FAQ = Path("/usr/share/doc/debian/FAQ")
HANDBOOK = Path("/usr/share/doc/debian-handbook/html")

# Language code -> its English name: the Debian Reference's and FAQ's translations.
DEBIAN_TEXT_LANGS = {
    "de": "German",
    "fr": "French",
    "es": "Spanish",
    "it": "Italian",
    "ja": "Japanese",
    "pt": "Portuguese",
    "zh-cn": "Chinese",
    "ru": "Russian",
    "nl": "Dutch",
}
FORTUNE_LANGS = {"de": "German", "zh": "Chinese", "ru": "Russian"}
# fortunes-zh puts its files beside the other packages' folders, not in a folder of its own.
_FORTUNE_FILES = {"zh": ("chinese", "tang300", "song100")}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")
_TAG = re.compile(r"<[^>]+>")


def size(text: str) -> int:
    """A length that means about the same in every script: words, or CJK characters / 2."""
    cjk = len(_CJK.findall(text))
    return len(text.split()) + cjk // 2


def join_lines(lines: list[str]) -> str:
    """Wrapped lines as one paragraph: a space between words, none inside CJK text (its line
    breaks fall between characters)."""
    out = lines[0] if lines else ""
    for ln in lines[1:]:
        cjk = _CJK.match(out[-1:]) and _CJK.match(ln[:1])
        out += ln if cjk else " " + ln
    return out


def _prose(text: str, min_size: int, max_size: int) -> bool:
    """A paragraph of running text: long enough, mostly letters, not a heading or a list."""
    if not min_size <= size(text) <= max_size or text.endswith(":"):
        return False
    letters = sum(c.isalpha() for c in text)
    return letters >= 0.6 * len(text) and "\ufffd" not in text


def _need(path: Path, package: str) -> None:
    if not path.exists():
        raise SpecUIError(
            f"{path} not found: install Debian's {package} (apt-get install {package})"
        )


def debian_text_paragraphs(
    lang: str, min_size: int = 12, max_size: int = 260, roots: tuple[Path, Path] = (REFERENCE, FAQ)
) -> list[list[str]]:
    """The Debian Reference and the Debian FAQ in ``lang`` (``en``, ``de``, ...), whichever are
    installed: their paragraphs of prose, one list per section (consecutive paragraphs belong
    together: a long passage joins them)."""
    reference, faq = roots
    candidates = (reference / f"debian-reference.{lang}.txt.gz", faq / f"debian-faq.{lang}.txt.gz")
    paths = [p for p in candidates if p.is_file()]
    if not paths:
        raise SpecUIError(
            f"no Debian Reference or FAQ in {lang!r}: apt-get install debian-reference-{lang}"
        )
    sections: list[list[str]] = [[]]
    for path in paths:
        text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        for block in re.split(r"\n\s*\n", text):
            lines = [ln.strip() for ln in block.strip().splitlines()]
            if not lines:
                continue
            if len(lines) == 1 and re.match(r"^(\d+\.)+\s\S|^[A-Z][a-z]+ \d+\.", lines[0]):
                sections.append([])  # a numbered heading: a new section starts
                continue
            if any(ln.startswith(("*", "|", "$", "#", "+--", "<", "[")) for ln in lines):
                continue  # lists, tables, shell sessions, link lists
            para = join_lines(lines)
            if _prose(para, min_size, max_size):
                sections[-1].append(para)
    return [s for s in sections if s]


def handbook_paragraphs(
    folder: str = "en-US", min_size: int = 12, max_size: int = 260, root: Path = HANDBOOK
) -> list[list[str]]:
    """The Debian Administrator's Handbook in one language folder (``en-US``, ``de-DE``, ...):
    the ``<p>`` paragraphs of each page, one list per page."""
    pages_dir = root / folder
    _need(pages_dir, "debian-handbook")
    pages = []
    for path in sorted(pages_dir.glob("*.html")):
        raw = path.read_text(encoding="utf-8", errors="replace")
        paras = []
        # The handbook's paragraphs are <div class="para"> (a few older pages use <p>).
        for p in re.findall(r'<div class="para"[^>]*>(.*?)</div>|<p[^>]*>(.*?)</p>', raw, re.S):
            p = p[0] or p[1]
            text = " ".join(html.unescape(_TAG.sub("", p)).split())
            if _prose(text, min_size, max_size):
                paras.append(text)
        if paras:
            pages.append(paras)
    return pages


def python_doc_paragraphs(min_size: int = 12, max_size: int = 260) -> list[list[str]]:
    """The Python documentation's prose paragraphs, one list per source file."""
    _need(PY_DOCS, "python3-doc")
    files = [
        rst_paragraphs(path, min_size, max_size) for path in sorted(PY_DOCS.rglob("*.rst.txt"))
    ]
    return [f for f in files if f]


def fortune_entries(
    lang: str, min_size: int = 8, max_size: int = 400, root: Path = FORTUNES
) -> list[str]:
    """Entries of Debian's fortunes in one language, whitespace kept as written (poems keep
    their lines), terminal colour codes removed."""
    if lang in _FORTUNE_FILES:
        paths = [root / name for name in _FORTUNE_FILES[lang]]
        for path in paths:
            _need(path, f"fortunes-{lang}")
    else:
        folder = root / lang
        _need(folder, f"fortunes-{lang}")
        paths = [p for p in sorted(folder.iterdir()) if p.suffix not in (".dat", ".u8")]
    out = []
    for path in paths:
        if not path.is_file():
            continue
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            entry = _ANSI.sub("", entry).strip("\n")
            if min_size <= size(entry) <= max_size and "\ufffd" not in entry:
                out.append(entry)
    return out


def stdlib_files() -> list[Path]:
    """The standard library's own modules (top level and packages; no tests, no vendored
    code), the source of long code to explain or review."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idlelib", "lib2to3", "site-packages", "ensurepip", "turtledemo")
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(p in skip or p.startswith(("test_", "_")) for p in parts):
            continue
        files.append(path)
    return files


def code_chunks(path: Path, min_lines: int = 50, max_lines: int = 220) -> list[str]:
    """A module cut at top-level statements into pieces of ``min_lines`` to ``max_lines``:
    whole functions and classes, never a definition cut in two."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    starts = [
        i
        for i, ln in enumerate(lines)
        if ln.startswith(("def ", "class ", "async def ", "@"))
        and (i == 0 or not lines[i - 1].startswith("@"))
    ]
    if not starts:
        return []
    chunks, begin = [], starts[0]
    for s in [*starts[1:], len(lines)]:
        if s - begin >= min_lines:
            if s - begin <= max_lines:
                chunks.append("\n".join(lines[begin:s]).rstrip())
            begin = s
    return chunks

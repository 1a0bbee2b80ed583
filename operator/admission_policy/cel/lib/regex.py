"""Kubernetes' regex library: ``find`` and ``findAll``, with Go's ``regexp`` syntax and results.

Kubernetes compiles the pattern with Go's ``regexp.Compile`` (RE2 syntax) and returns
``FindString`` / ``FindAllString``. Python's ``re`` is another language: it accepts
look-arounds and back-references that Go refuses, reads ``$``, ``\\s``, ``\\d`` and ``{,n}``
otherwise, and backtracks, so a pattern can take exponential time. Here:

- ``_Parser`` is Go's ``regexp/syntax`` parser, step for step: it accepts exactly what Go
  accepts and fails with Go's error text ("error parsing regexp: missing closing ]: `[`"),
  including Go's limits (repeat counts, nesting depth, program size);
- its tree is written back as an RE2 pattern with nothing left to interpretation (every
  literal as ``\\x{…}``, every flag applied where it was in force), which the RE2 engine of
  ``google-re2`` runs: Go's engine and RE2 are the same design (leftmost-first, linear time);
- ``_find_all`` is Go's loop over successive matches (an empty match right after a match is
  skipped).

Unicode classes (``\\p{Greek}``) take RE2's Unicode tables, which may be a version apart from
Go's; the 32M-rune limit of Go's parser does not count them (RE2's own size limit applies).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any, Final

import re2
from cel_expr_python import cel

from ...errors import AdmissionPolicyError
from .. import syntax
from .library import Library, function, overload

# --- Go's parser -------------------------------------------------------------------------------

_FOLD_CASE, _DOT_NL, _ONE_LINE, _NON_GREEDY = 1, 2, 4, 8
_MAX_RUNE: Final = 0x10FFFF
_MAX_REPEAT: Final = 1000     # any x{n,m}, and the product of nested ones
_MAX_HEIGHT: Final = 1000     # of the parse tree
_MAX_SIZE: Final = (128 << 20) // 40   # compiled instructions (128 MB of Go's)
_MAX_RUNES: Final = (128 << 20) // 4   # runes in all literals and classes

_PSEUDO: Final = frozenset({"left_paren", "vertical_bar"})
_PERL_CLASSES: Final = frozenset({"d", "D", "s", "S", "w", "W"})
_POSIX_CLASSES: Final = frozenset({"alnum", "alpha", "ascii", "blank", "cntrl", "digit", "graph", "lower", "print",
                                   "punct", "space", "upper", "word", "xdigit"})
# Go's general categories (since Go 1.25 with LC and Cn, and C including Cn).
_CATEGORY_NAMES: Final = ("C Cc Cf Cn Co Cs L LC Ll Lm Lo Lt Lu M Mc Me Mn N Nd Nl No "
                          "P Pc Pd Pe Pf Pi Po Ps S Sc Sk Sm So Z Zl Zp Zs")
_CATEGORIES: Final = frozenset(_CATEGORY_NAMES.split())
_CATEGORY_ALIASES: Final = {
    "Other": "C", "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Unassigned": "Cn", "Private_Use": "Co",
    "Surrogate": "Cs", "Letter": "L", "Cased_Letter": "LC", "Lowercase_Letter": "Ll", "Modifier_Letter": "Lm",
    "Other_Letter": "Lo", "Titlecase_Letter": "Lt", "Uppercase_Letter": "Lu", "Mark": "M", "Combining_Mark": "M",
    "Spacing_Mark": "Mc", "Enclosing_Mark": "Me", "Nonspacing_Mark": "Mn", "Number": "N", "Decimal_Number": "Nd",
    "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P", "punct": "P",
    "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Close_Punctuation": "Pe", "Final_Punctuation": "Pf",
    "Initial_Punctuation": "Pi", "Other_Punctuation": "Po", "Open_Punctuation": "Ps", "Symbol": "S",
    "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Math_Symbol": "Sm", "Other_Symbol": "So", "Separator": "Z",
    "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Space_Separator": "Zs"}
# Go's scripts (Unicode 15), named as RE2 names them too.
_SCRIPT_NAMES_TEXT: Final = """
    Adlam Ahom Anatolian_Hieroglyphs Arabic Armenian Avestan Balinese Bamum Bassa_Vah Batak Bengali Bhaiksuki
    Bopomofo Brahmi Braille Buginese Buhid Canadian_Aboriginal Carian Caucasian_Albanian Chakma Cham Cherokee
    Chorasmian Common Coptic Cuneiform Cypriot Cypro_Minoan Cyrillic Deseret Devanagari Dives_Akuru Dogra Duployan
    Egyptian_Hieroglyphs Elbasan Elymaic Ethiopic Georgian Glagolitic Gothic Grantha Greek Gujarati Gunjala_Gondi
    Gurmukhi Han Hangul Hanifi_Rohingya Hanunoo Hatran Hebrew Hiragana Imperial_Aramaic Inherited
    Inscriptional_Pahlavi Inscriptional_Parthian Javanese Kaithi Kannada Katakana Kawi Kayah_Li Kharoshthi
    Khitan_Small_Script Khmer Khojki Khudawadi Lao Latin Lepcha Limbu Linear_A Linear_B Lisu Lycian Lydian Mahajani
    Makasar Malayalam Mandaic Manichaean Marchen Masaram_Gondi Medefaidrin Meetei_Mayek Mende_Kikakui
    Meroitic_Cursive Meroitic_Hieroglyphs Miao Modi Mongolian Mro Multani Myanmar Nabataean Nag_Mundari Nandinagari
    New_Tai_Lue Newa Nko Nushu Nyiakeng_Puachue_Hmong Ogham Ol_Chiki Old_Hungarian Old_Italic Old_North_Arabian
    Old_Permic Old_Persian Old_Sogdian Old_South_Arabian Old_Turkic Old_Uyghur Oriya Osage Osmanya Pahawh_Hmong
    Palmyrene Pau_Cin_Hau Phags_Pa Phoenician Psalter_Pahlavi Rejang Runic Samaritan Saurashtra Sharada Shavian
    Siddham SignWriting Sinhala Sogdian Sora_Sompeng Soyombo Sundanese Syloti_Nagri Syriac Tagalog Tagbanwa Tai_Le
    Tai_Tham Tai_Viet Takri Tamil Tangsa Tangut Telugu Thaana Thai Tibetan Tifinagh Tirhuta Toto Ugaritic Vai
    Vithkuqi Wancho Warang_Citi Yezidi Yi Zanabazar_Square"""
_SCRIPTS: Final = frozenset(_SCRIPT_NAMES_TEXT.split())
# Every code point RE2's categories (which leave out Cn, as Go's did before 1.25) do not cover.
_ASSIGNED: Final = r"\p{C}\p{L}\p{M}\p{N}\p{P}\p{S}\p{Z}"


class RegexError(AdmissionPolicyError, ValueError):
    """A pattern Go's ``regexp.Compile`` refuses; the message is Go's."""

    def __init__(self, code: str, expr: str) -> None:
        super().__init__(f"error parsing regexp: {code}: `{expr}`")


@dataclasses.dataclass(eq=False)
class _Node:
    """One node of Go's parse tree (``syntax.Regexp``), with the RE2 text of a class."""
    op: str
    flags: int = 0
    runes: list[int] = dataclasses.field(default_factory=list)   # literal
    items: str = ""          # char class: the RE2 text between the brackets
    negated: bool = False    # char class
    subs: list[_Node] = dataclasses.field(default_factory=list)
    min: int = 0
    max: int = 0
    cap: int = 0             # left_paren: its capture number, 0 for a group only
    height: int = 1
    size: int = 1

    def measure(self) -> None:
        """Go's height and compiled size (``calcHeight``, ``calcSize``) from the children's."""
        self.height = 1 + max((sub.height for sub in self.subs), default=0)
        sub = self.subs[0].size if self.subs else 0
        if self.op == "literal":
            size = len(self.runes)
        elif self.op in ("capture", "star"):
            size = 2 + sub
        elif self.op in ("plus", "quest"):
            size = 1 + sub
        elif self.op in ("concat", "alternate"):
            size = sum(s.size for s in self.subs) + (len(self.subs) - 1 if self.op == "alternate" else 0)
        elif self.op == "repeat":
            if self.max == -1:
                size = 2 + sub if self.min == 0 else 1 + self.min * sub
            else:
                size = self.max * sub + (self.max - self.min)
        else:
            size = 1
        self.size = max(1, size)


def _canonical(name: str) -> str:
    """Go's ``canonicalName``: ``old_italic``, ``Old Italic`` and ``OLD-ITALIC`` read alike."""
    out, first = [], True
    for char in name:
        if char in "_- ":
            continue
        if first:
            out.append(char.upper() if "a" <= char <= "z" else char)
            first = False
        else:
            out.append(char.lower() if "A" <= char <= "Z" else char)
    return "".join(out)


_SCRIPT_NAMES: Final = {_canonical(name): name for name in _SCRIPTS}
_ALIAS_NAMES: Final = {_canonical(alias): category for alias, category in _CATEGORY_ALIASES.items()}


@functools.cache
def _unassigned() -> str:
    """Go's Cn (unassigned code points) as RE2 ranges: RE2 has no such table, so it is read
    off RE2's own categories (surrogates are Cs, and are left out of the text)."""
    text = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, _MAX_RUNE + 1)))
    ranges = []
    for match in re2.compile(f"[^{_ASSIGNED}]+", _options()).finditer(text):
        low, high = match.start(), match.end() - 1
        low, high = (point if point < 0xD800 else point + 0x800 for point in (low, high))
        ranges.append(f"{_rune(low)}-{_rune(high)}")
    return "".join(ranges)


def _unicode_items(name: str, negated: bool) -> str | None:
    """RE2 class items for Go's ``\\p{name}`` (``\\P`` when negated), or None for a name Go
    does not know. Go's C includes Cn, and it has LC, Cn, Assigned and ASCII, which RE2 has not."""
    name = _canonical(name)
    if name == "Assigned":
        name, negated = "Cn", not negated
    table = {"Any": "Any", "Ascii": "ASCII", "Lc": "LC"}.get(name) or (name if name in _CATEGORIES else None)
    table = table or (name if name in _SCRIPTS else None) or _ALIAS_NAMES.get(name) or _SCRIPT_NAMES.get(name)
    if table is None:
        return None
    special = {
        "Any": (f"{_rune(0)}-{_rune(_MAX_RUNE)}", ""),
        "ASCII": ("[:ascii:]", "[:^ascii:]"),
        "LC": (r"\p{Lu}\p{Ll}\p{Lt}", r"\P{L}\p{Lm}\p{Lo}"),
    }
    if table in special:
        return special[table][negated]
    if table == "C":
        return r"\p{L}\p{M}\p{N}\p{P}\p{S}\p{Z}" if negated else r"\p{C}" + _unassigned()
    if table == "Cn":
        return _ASSIGNED if negated else _unassigned()
    return ("\\P{%s}" if negated else "\\p{%s}") % table


def _rune(value: int) -> str:
    return f"\\x{{{value:X}}}"


def _unhex(char: str) -> int:
    return int(char, 16) if char in "0123456789abcdefABCDEF" else -1


class _Parser:
    """Go's ``syntax.parser`` with the Perl flags ``regexp.Compile`` uses. Its stack holds the
    pieces parsed so far and the pseudo-nodes for ``(`` and ``|``. Go's alternation factoring
    is left out: it changes no meaning, only the tree's size at the margin of the limits."""

    def __init__(self, pattern: str) -> None:
        self.whole = pattern
        self.flags = _ONE_LINE
        self.stack: list[_Node] = []
        self.allocated = 0     # Go's numRegexp: nodes made, not counting reused ones
        self.free = 0          # nodes Go would have put back for reuse
        self.runes = 0
        self.repeats = 1
        self.sizing = False
        self.heights = False

    # Node bookkeeping, as Go counts it for its limits.
    def new(self, op: str, **fields: Any) -> _Node:
        if self.free:
            self.free -= 1
        else:
            self.allocated += 1
        return _Node(op, **fields)

    def check_limits(self, node: _Node) -> None:
        """Go's ``checkLimits``: rune count, compiled size and height, each measured only once
        the pattern is large enough to approach it (as Go does, to stay fast)."""
        if self.runes > _MAX_RUNES:
            raise RegexError("expression too large", self.whole)
        if not self.sizing:
            self.start_sizing(node)
        if self.sizing and node.size > _MAX_SIZE:
            raise RegexError("expression too large", self.whole)
        if self.allocated >= _MAX_HEIGHT:
            tall = node.height > _MAX_HEIGHT
            if not self.heights:   # from now on, as Go starts measuring heights
                self.heights, tall = True, tall or any(item.height > _MAX_HEIGHT for item in self.stack)
            if tall:
                raise RegexError("expression nests too deeply", self.whole)

    def start_sizing(self, node: _Node) -> None:
        """Go measures sizes once the nodes made, times every repeat count seen, could reach
        the limit; then it measures what is already on the stack too."""
        if node.op == "repeat":
            count = max(node.max if node.max != -1 else node.min, 1)
            self.repeats = _MAX_SIZE if count > _MAX_SIZE // self.repeats else self.repeats * count
        self.sizing = self.allocated >= _MAX_SIZE // self.repeats
        if self.sizing and any(item.size > _MAX_SIZE for item in self.stack):
            raise RegexError("expression too large", self.whole)

    def push(self, node: _Node) -> None:
        self.runes += len(node.runes)
        self.concat_literals()
        node.measure()
        self.stack.append(node)
        self.check_limits(node)

    def concat_literals(self) -> None:
        """Go's ``maybeConcat``: two literals on top of the stack with the same case folding
        become one, as the next piece is pushed (so ``ab*`` stays ``a(b*)``)."""
        if len(self.stack) < 2:
            return
        last, before = self.stack[-1], self.stack[-2]
        if last.op != "literal" or before.op != "literal" or last.flags & _FOLD_CASE != before.flags & _FOLD_CASE:
            return
        before.runes += last.runes
        before.measure()
        self.stack.pop()
        self.free += 1

    def literal(self, rune: int) -> None:
        self.push(self.new("literal", flags=self.flags, runes=[rune]))

    def op(self, op: str) -> _Node:
        node = self.new(op, flags=self.flags)
        self.push(node)
        return node

    # The grammar.
    def parse(self) -> _Node:
        text = self.whole
        last_repeat = ""
        while text:
            repeat = ""
            head = text[0]
            if head == "(":
                if text.startswith("(?"):
                    text = self.perl_flags(text)
                else:
                    self.op("left_paren").cap = 1
                    text = text[1:]
            elif head == "|":
                self.vertical_bar()
                text = text[1:]
            elif head == ")":
                self.right_paren()
                text = text[1:]
            elif head in "^$.":
                if head == ".":
                    self.op("any_char" if self.flags & _DOT_NL else "any_char_not_nl")
                elif self.flags & _ONE_LINE:
                    self.op("begin_text" if head == "^" else "end_text")
                else:
                    self.op("begin_line" if head == "^" else "end_line")
                text = text[1:]
            elif head == "[":
                text = self.char_class(text)
            elif head in "*+?":
                op = {"*": "star", "+": "plus", "?": "quest"}[head]
                repeat, text = text, self.repeat(op, 0, 0, text, text[1:], last_repeat)
            elif head == "{":
                bounds = self.repeat_bounds(text)
                if bounds is None:
                    self.literal(ord("{"))   # not a repetition: { is itself
                    text = text[1:]
                else:
                    low, high, after = bounds
                    if low < 0 or low > _MAX_REPEAT or high > _MAX_REPEAT or 0 <= high < low:
                        raise RegexError("invalid repeat count", text[:len(text) - len(after)])
                    repeat, text = text, self.repeat("repeat", low, high, text, after, last_repeat)
            elif head == "\\":
                text = self.backslash(text)
            else:
                self.literal(ord(head))
                text = text[1:]
            last_repeat = repeat
        self.concat()
        if self.swap_vertical_bar():
            self.stack.pop()
        self.alternate()
        if len(self.stack) != 1:
            raise RegexError("missing closing )", self.whole)
        return self.stack[0]

    def backslash(self, text: str) -> str:
        if len(text) >= 2:
            simple = {"A": "begin_text", "b": "word_boundary", "B": "no_word_boundary", "z": "end_text"}
            if text[1] in simple:
                self.op(simple[text[1]])
                return text[2:]
            if text[1] == "C":   # any byte: not supported
                raise RegexError("invalid escape sequence", text[:2])
            if text[1] == "Q":   # \Q…\E: all literal
                quoted, _, rest = text[2:].partition("\\E")
                for char in quoted:
                    self.literal(ord(char))
                return rest
            if text[1] in "pP":
                items, rest = self.unicode_class(text)
                self.push(self.new("char_class", flags=self.flags, items=items))
                return rest
            if text[1] in _PERL_CLASSES:
                self.push(self.new("char_class", flags=self.flags, items=text[:2]))
                return text[2:]
        rune, rest = self.escape(text)
        self.literal(rune)
        return rest

    def repeat_bounds(self, text: str) -> tuple[int, int, str] | None:
        """Go's ``parseRepeat``: (min, max or -1 for none, rest) of ``{n}``, ``{n,}``, ``{n,m}``;
        min -1 for a number too large."""
        low, rest = self.integer(text[1:])
        if low is None or not rest:
            return None
        if rest[0] != ",":
            high = low
        else:
            rest = rest[1:]
            if not rest:
                return None
            if rest[0] == "}":
                high = -1
            else:
                high_value, rest = self.integer(rest)
                if high_value is None:
                    return None
                high = high_value
                if high < 0:
                    low = -1
        if not rest or rest[0] != "}":
            return None
        return low, high, rest[1:]

    @staticmethod
    def integer(text: str) -> tuple[int | None, str]:
        """Go's ``parseInt``: a decimal number without a leading zero, -1 once it passes 10^8."""
        digits = len(text) - len(text.lstrip("0123456789"))
        if digits == 0 or (digits >= 2 and text[0] == "0"):
            return None, text
        value = 0
        for char in text[:digits]:
            if value >= 10 ** 8:
                value = -1
                break
            value = value * 10 + int(char)
        return value, text[digits:]

    def repeat(self, op: str, low: int, high: int, before: str, after: str, last_repeat: str) -> str:
        flags = self.flags
        if after.startswith("?"):
            after, flags = after[1:], flags ^ _NON_GREEDY
        if last_repeat:   # a** is an error in Perl, and a++ means something else
            raise RegexError("invalid nested repetition operator", last_repeat[:len(last_repeat) - len(after)])
        if not self.stack or self.stack[-1].op in _PSEUDO:
            raise RegexError("missing argument to repetition operator", before[:len(before) - len(after)])
        node = self.new(op, flags=flags, min=low, max=high, subs=[self.stack[-1]])
        node.measure()
        self.stack[-1] = node
        self.check_limits(node)
        if op == "repeat" and (low >= 2 or high >= 2) and not _repeat_fits(node, _MAX_REPEAT):
            raise RegexError("invalid repeat count", before[:len(before) - len(after)])
        return after

    def perl_flags(self, text: str) -> str:
        """``(?P<name>``, ``(?<name>``, ``(?flags)`` and ``(?flags:``."""
        named = text.startswith("(?P<") and len(text) > 4
        if named or (text.startswith("(?<") and len(text) > 3):
            end = text.find(">")
            if end < 0:
                raise RegexError("invalid named capture", text)
            name = text[4 if named else 3:end]
            if not name or not all(char == "_" or (char.isascii() and char.isalnum()) for char in name):
                raise RegexError("invalid named capture", text[:end + 1])
            self.op("left_paren").cap = 1
            return text[end + 1:]
        flags, negated, saw_flag = self.flags, False, False
        rest = text[2:]
        while rest:
            char, rest = rest[0], rest[1:]
            if char in "imsU":
                bit = {"i": _FOLD_CASE, "m": _ONE_LINE, "s": _DOT_NL, "U": _NON_GREEDY}[char]
                # m turns one-line mode off: its bit is set by clearing it, and the reverse.
                flags = flags & ~bit if (char == "m") != negated else flags | bit
                saw_flag = True
            elif char == "-" and not negated:
                negated, saw_flag = True, False
            elif char in ":)" and not (negated and not saw_flag):
                if char == ":":
                    self.op("left_paren")
                self.flags = flags
                return rest
            else:
                break
        raise RegexError("invalid or unsupported Perl syntax", text[:len(text) - len(rest)])

    def escape(self, text: str) -> tuple[int, str]:
        """Go's ``parseEscape``: the rune of an escape that stands for one character."""
        if len(text) < 2:
            raise RegexError("trailing backslash at end of expression", "")
        char, rest = text[1], text[2:]
        if char.isascii() and not char.isalnum():
            return ord(char), rest   # punctuation escapes itself
        # Octal: \0, or 1-7 followed by another octal digit (a lone \1 would be a back-reference).
        if (char in "1234567" and rest[:1] and rest[0] in "01234567") or char == "0":
            value = int(char)
            for _ in range(2):   # up to three octal digits in all
                if not rest or rest[0] not in "01234567":
                    break
                value, rest = value * 8 + int(rest[0]), rest[1:]
            return value, rest
        if char == "x" and rest:
            return self.hex_escape(text, rest)
        controls = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
        if char in controls:
            return controls[char], rest
        raise RegexError("invalid escape sequence", text[:2])

    @staticmethod
    def hex_escape(text: str, rest: str) -> tuple[int, str]:
        """``\\xFF`` or ``\\x{10FFFF}``; an error names what was read up to the offending character."""
        char, rest = rest[0], rest[1:]
        if char == "{":
            value = digits = 0
            while True:
                if not rest:
                    raise RegexError("invalid escape sequence", text)
                char, rest = rest[0], rest[1:]
                if char == "}":
                    break
                value = value * 16 + _unhex(char)
                if _unhex(char) < 0 or value > _MAX_RUNE:
                    raise RegexError("invalid escape sequence", text[:len(text) - len(rest)])
                digits += 1
            if digits == 0:
                raise RegexError("invalid escape sequence", text[:len(text) - len(rest)])
            return value, rest
        second, rest = (rest[0], rest[1:]) if rest else ("", rest)
        if _unhex(char) < 0 or not second or _unhex(second) < 0:
            raise RegexError("invalid escape sequence", text[:len(text) - len(rest)])
        return _unhex(char) * 16 + _unhex(second), rest

    def unicode_class(self, text: str) -> tuple[str, str]:
        """``\\pL``, ``\\p{Greek}``, ``\\P{^Greek}``: (RE2 class items, rest)."""
        negated = text[1] == "P"
        if text[2:3] != "{":
            sequence = text[:3]
            name = sequence[2:]
        else:
            end = text.find("}")
            if end < 0:
                raise RegexError("invalid character class range", text)
            sequence, name = text[:end + 1], text[3:end]
        rest = text[len(sequence):]
        if name.startswith("^"):
            negated, name = not negated, name[1:]
        items = _unicode_items(name, negated)
        if items is None:
            raise RegexError("invalid character class range", sequence)
        return items, rest

    def char_class(self, text: str) -> str:
        """Go's ``parseClass``: ``[…]`` up to its ``]``; the items are kept as RE2 text."""
        rest = text[1:]
        negated = rest.startswith("^")
        if negated:
            rest = rest[1:]
        items: list[str] = []
        first = True   # ] is literal as the first item
        while not rest or rest[0] != "]" or first:
            first = False
            if rest.startswith("[:") and len(rest) > 2:
                end = rest.find(":]", 2)
                if end >= 0:
                    name = rest[:end + 2]
                    if name[2:-2].removeprefix("^") not in _POSIX_CLASSES:
                        raise RegexError("invalid character class range", name)
                    items.append(name)
                    rest = rest[end + 2:]
                    continue
            if rest[:2] in ("\\p", "\\P"):
                found, rest = self.unicode_class(rest)
                items.append(found)
                continue
            if rest[:1] == "\\" and rest[1:2] in _PERL_CLASSES:
                items.append(rest[:2])
                rest = rest[2:]
                continue
            start = rest
            low, rest = self.class_char(rest, text)
            high = low
            if len(rest) >= 2 and rest[0] == "-" and rest[1] != "]":
                high, rest = self.class_char(rest[1:], text)
                if high < low:
                    raise RegexError("invalid character class range", start[:len(start) - len(rest)])
            items.append(_rune(low) if low == high else f"{_rune(low)}-{_rune(high)}")
            self.runes += 2
        self.push(self.new("char_class", flags=self.flags, items="".join(items), negated=negated))
        return rest[1:]

    def class_char(self, text: str, whole_class: str) -> tuple[int, str]:
        if not text:
            raise RegexError("missing closing ]", whole_class)
        if text[0] == "\\":
            return self.escape(text)
        return ord(text[0]), text[1:]

    # Alternation and grouping.
    def concat(self) -> None:
        self.concat_literals()
        index = len(self.stack)
        while index > 0 and self.stack[index - 1].op not in _PSEUDO:
            index -= 1
        parts = self.stack[index:]
        del self.stack[index:]
        self.push(self.collapse(parts, "concat") if parts else self.new("empty_match"))

    def alternate(self) -> None:
        index = len(self.stack)
        while index > 0 and self.stack[index - 1].op not in _PSEUDO:
            index -= 1
        parts = self.stack[index:]
        del self.stack[index:]
        self.push(self.collapse(parts, "alternate") if parts else self.new("no_match"))

    def collapse(self, parts: list[_Node], op: str) -> _Node:
        """One node for the parts; a part of the same op is spliced in (no concat of concats)."""
        if len(parts) == 1:
            return parts[0]
        node = self.new(op)
        for part in parts:
            if part.op == op:
                node.subs += part.subs
                self.free += 1
            else:
                node.subs.append(part)
        return node

    def vertical_bar(self) -> None:
        self.concat()
        if not self.swap_vertical_bar():
            self.op("vertical_bar")

    def swap_vertical_bar(self) -> bool:
        """With a piece above a ``|`` marker, move the marker up: what is below it becomes the
        alternation's branches."""
        if len(self.stack) >= 2 and self.stack[-2].op == "vertical_bar":
            self.stack[-2], self.stack[-1] = self.stack[-1], self.stack[-2]
            return True
        return False

    def right_paren(self) -> None:
        self.concat()
        if self.swap_vertical_bar():
            self.stack.pop()
        self.alternate()
        if len(self.stack) < 2 or self.stack[-2].op != "left_paren":
            raise RegexError("unexpected )", self.whole)
        inner, paren = self.stack.pop(), self.stack.pop()
        self.flags = paren.flags   # as they were at the (
        if paren.cap:
            paren.op, paren.subs = "capture", [inner]
            self.push(paren)
        else:
            self.push(inner)


def _repeat_fits(node: _Node, budget: int) -> bool:
    """Go's ``repeatIsValid``: nested repetitions multiply to at most ``budget`` copies."""
    if node.op == "repeat":
        count = node.max if node.max != -1 else node.min
        if count == 0:
            return True
        if count > budget:
            return False
        budget //= max(count, 1)
    return all(_repeat_fits(sub, budget) for sub in node.subs)


# --- the RE2 text of a tree ------------------------------------------------------------------------

def _render(root: _Node) -> str:
    """The tree as an RE2 pattern that means the same with no flags in effect: each piece
    carries the flags it was parsed under. Iterative: a tree may be 1000 deep."""
    out: list[str] = []
    work: list[_Node | str] = [root]
    while work:
        item = work.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        pieces = _pieces(item)
        work.extend(reversed(pieces))
    return "".join(out)


def _pieces(node: _Node) -> list[_Node | str]:
    op = node.op
    fold = node.flags & _FOLD_CASE
    if op == "literal":
        text = "".join(map(_rune, node.runes))
        return [f"(?i:{text})" if fold else text]
    if op == "char_class":
        body = node.items
        if not body:
            return ["[\\x{0}-\\x{10FFFF}]" if node.negated else "[^\\x{0}-\\x{10FFFF}]"]
        text = f"[{'^' if node.negated else ''}{body}]"
        return [f"(?i:{text})" if fold else text]
    simple = {"any_char": "(?s:.)", "any_char_not_nl": "[^\\n]", "begin_line": "(?m:^)", "end_line": "(?m:$)",
              "begin_text": "\\A", "end_text": "\\z", "word_boundary": "\\b", "no_word_boundary": "\\B",
              "empty_match": "(?:)", "no_match": "[^\\x{0}-\\x{10FFFF}]"}
    if op in simple:
        return [simple[op]]
    if op == "concat":
        return list(node.subs)
    if op == "alternate":
        pieces: list[_Node | str] = ["(?:"]
        for index, sub in enumerate(node.subs):
            pieces += (["|"] if index else []) + [sub]
        return [*pieces, ")"]
    lazy = "?" if node.flags & _NON_GREEDY else ""
    if op == "capture":
        return ["(?:", node.subs[0], ")"]
    if op in ("star", "plus", "quest"):
        return ["(?:", node.subs[0], ")" + {"star": "*", "plus": "+", "quest": "?"}[op] + lazy]
    bounds = f"{node.min}," if node.max == -1 else f"{node.min}" if node.min == node.max else f"{node.min},{node.max}"
    return ["(?:", node.subs[0], f"){{{bounds}}}{lazy}"]


# --- compiling and matching ------------------------------------------------------------------------

def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = 256 << 20   # Go's own limits (above) bound the program first
    return options


@functools.lru_cache(maxsize=512)
def _compile(pattern: str) -> Any:
    """The RE2 program for a Go pattern, or RegexError with Go's message."""
    tree = _Parser(pattern).parse()
    try:
        return re2.compile(_render(tree), _options())
    except re2.error:
        raise RegexError("expression too large", pattern) from None


def pattern_error(pattern: str) -> str | None:
    """Go's error for a pattern ``regexp.Compile`` refuses, or None."""
    try:
        _compile(pattern)
    except RegexError as error:
        return str(error)
    return None


def _program(pattern: str) -> Any:
    try:
        return _compile(pattern)
    except RegexError as error:
        raise ValueError(f"Illegal regex: {error}") from None


def _matches(text: str, pattern: str, limit: int) -> Iterator[str]:
    """Go's ``allMatches``: successive leftmost-first matches; after an empty match the search
    moves on one character, and an empty match right where the last match ended is skipped."""
    program = _program(pattern)
    data = text.encode()
    position, previous_end, found = 0, -1, 0
    while found < limit and position <= len(data):
        match = program.search(data, position)
        if match is None:
            return
        start, end = match.span()
        accept = True
        if end == position:   # empty
            accept = start != previous_end
            position += _rune_width(data, position) if position < len(data) else 1
        else:
            position = end
        previous_end = end
        if accept:
            found += 1
            yield data[start:end].decode()


def _rune_width(data: bytes, index: int) -> int:
    lead = data[index]
    return 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def _find(text: str, pattern: str) -> str:
    return next(_matches(text, pattern, 1), "")


def _find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    # Go's int(n): a negative limit means all of them.
    return list(_matches(text, pattern, limit if limit >= 0 else len(text.encode()) + 1))


def constant_pattern_errors(checked: syntax.Checked) -> list[str]:
    """Go's errors for the literal patterns of ``find``/``findAll`` calls: Kubernetes compiles
    those when it builds the program, so such an expression fails then, not when it runs."""
    errors = []
    for node in syntax.walk(checked.root):
        ids = checked.overloads.get(node.id, ())
        if node.kind == "call" and any(overload_id.startswith("string_find") for overload_id in ids):
            pattern = node.args[0].constant() if node.args and node.args[0].kind == "const" else None
            if isinstance(pattern, str) and (error := pattern_error(pattern)) is not None:
                errors.append(error)
    return errors


_S: Final = cel.Type.STRING

LIBRARY: Final = Library("regex", "1.0", functions=(
    function("find", overload("string_find_string", _S, [_S, _S], _find, member=True)),
    function("findAll",
             overload("string_find_all_string", cel.Type.List(_S), [_S, _S], _find_all, member=True),
             overload("string_find_all_string_int", cel.Type.List(_S), [_S, _S, cel.Type.INT], _find_all,
                      member=True)),
), summary="find() and findAll() with Go's regexp (RE2) syntax")

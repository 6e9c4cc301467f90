"""Hard cases for the ``math`` reward, each with its verdict written by hand from the maths.

Read by ``test_reward_hard_cases.py`` (the reward must agree with every verdict, except the
known disagreements below, which must still disagree) and by ``bench/rewards_agreement.py``
(agreement of the old and the new reward with these verdicts; table in
docs/tasks-and-rewards.md). Every output has a final answer (``\\boxed{}`` or an ``Answer:``
line), so each verdict is about the maths of that answer against the gold answer, not about
extraction.

Conventions of the verdicts, where the maths alone leaves a choice:

- a gold answer that is a bare number for a question asked in percent or in a unit means that
  many percent or units: ``25\\%`` and ``12 cm`` equal the gold ``25`` and ``12``;
- a list of values answers a question asking for all solutions: ``1, 2`` equals ``\\{1, 2\\}``;
- a decimal equals a fraction only when it is exactly equal (``0.75 = 3/4``); a rounded or
  truncated decimal (``0.3333``) is not the fraction it approximates, nor is ``3.14`` pi;
- letter case matters in expressions (``X`` and ``x`` are different variables), not in words
  (``Yes`` = ``yes``).

:data:`KNOWN_DISAGREEMENTS` maps a case id to why the new (math-verify) reward gets it wrong.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    output: str
    """The end of the model's output (its final answer is in a box or an ``Answer:`` line)."""
    gold: str
    expected: bool
    """Whether the final answer equals the gold answer, decided by hand from the maths."""


def _c(id: str, category: str, output: str, gold: str, expected: bool) -> Case:
    return Case(id, category, output, gold, expected)


CASES: tuple[Case, ...] = (
    # --- integers and their spellings
    _c("int-plain", "integer", r"\boxed{42}", "42", True),
    _c("int-plus", "integer", r"\boxed{+42}", "42", True),
    _c("int-zeros", "integer", "Answer: 0042", "42", True),
    _c("int-wrong", "integer", r"\boxed{41}", "42", False),
    _c("int-sign", "integer", r"\boxed{-3}", "3", False),
    _c("int-neg-ok", "integer", "Answer: -3", "-3", True),
    _c("int-period", "integer", "Answer: 42.", "42", True),
    _c("int-float", "integer", r"\boxed{42.0}", "42", True),
    _c("int-comma", "integer", r"\boxed{1,234,567}", "1234567", True),
    _c("int-latex-comma", "integer", r"\boxed{1{,}000}", "1000", True),
    _c("int-thin-space", "integer", r"\boxed{1\,234}", "1234", True),
    _c("int-space-sep", "integer", "Answer: 1 000 000", "1000000", True),
    _c("int-comma-list", "integer", r"\boxed{1, 234}", "1234", False),
    _c("int-minus-sign", "integer", "Answer: \u22127", "-7", True),
    _c("int-fullwidth", "integer", "Answer: ４２", "42", True),
    _c("int-arabic", "integer", "Answer: ٤٢", "42", True),
    _c("int-dollars", "integer", r"\boxed{\$5}", "5", True),
    _c("int-dollars-cents", "integer", r"\boxed{\$5.00}", "5", True),
    _c("int-math-mode", "integer", r"Answer: $17$", "17", True),
    _c("int-sci", "integer", r"\boxed{1.5 \times 10^{3}}", "1500", True),
    _c("int-sci-e", "integer", "Answer: 1e3", "1000", True),
    _c("int-sci-wrong", "integer", r"\boxed{1.5 \times 10^{4}}", "1500", False),
    _c("int-text-number", "integer", r"\boxed{\text{twelve}}", "12", True),
    _c("int-zero-neg", "integer", r"\boxed{-0}", "0", True),
    # --- fractions
    _c("frac-latex", "fraction", r"\boxed{\frac{1}{2}}", "0.5", True),
    _c("frac-dfrac", "fraction", r"\boxed{\dfrac{3}{4}}", "3/4", True),
    _c("frac-tfrac", "fraction", r"\boxed{\tfrac{3}{4}}", "0.75", True),
    _c("frac-short", "fraction", r"\boxed{\frac12}", "1/2", True),
    _c("frac-unsimplified", "fraction", r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", True),
    _c("frac-slash", "fraction", "Answer: 3/4", r"\frac{3}{4}", True),
    _c("frac-neg-num", "fraction", r"\boxed{\frac{-3}{4}}", r"-\frac{3}{4}", True),
    _c("frac-neg-den", "fraction", r"\boxed{\frac{3}{-4}}", "-0.75", True),
    _c("frac-inverted", "fraction", r"\boxed{\frac{4}{3}}", r"\frac{3}{4}", False),
    _c("frac-mixed", "fraction", r"\boxed{2\frac{1}{2}}", r"\frac{5}{2}", True),
    _c("frac-mixed-wrong", "fraction", r"\boxed{2\frac{1}{2}}", "1", False),
    _c("frac-nested", "fraction", r"\boxed{\frac{1}{1+\frac{1}{2}}}", r"\frac{2}{3}", True),
    _c("frac-vulgar", "fraction", "Answer: ½", "0.5", True),
    _c("frac-truncated", "fraction", r"\boxed{0.3333}", r"\frac{1}{3}", False),
    _c("frac-7-digits", "fraction", r"\boxed{0.3333333}", r"\frac{1}{3}", False),
    _c("frac-repeating", "fraction", r"\boxed{0.\overline{3}}", r"\frac{1}{3}", True),
    _c("frac-exact-decimal", "fraction", r"\boxed{0.125}", r"\frac{1}{8}", True),
    _c("frac-rounded", "fraction", r"\boxed{0.67}", r"\frac{2}{3}", False),
    _c("frac-ratio", "fraction", r"\boxed{3:4}", r"\frac{3}{4}", True),
    _c("frac-percent-of", "fraction", r"\boxed{\frac{3}{4}}", "75\\%", True),
    # --- decimals
    _c("dec-trailing-zero", "decimal", r"\boxed{0.50}", "0.5", True),
    _c("dec-leading-dot", "decimal", r"\boxed{.5}", "0.5", True),
    _c("dec-wrong", "decimal", r"\boxed{0.55}", "0.5", False),
    _c("dec-neg", "decimal", r"\boxed{-1234.5}", "-1,234.5", True),
    _c("dec-close", "decimal", r"\boxed{2.0001}", "2", False),
    _c("dec-money", "decimal", r"\boxed{\$18.90}", "18.9", True),
    # --- roots, pi, e, exact forms
    _c("root-simplify", "exact form", r"\boxed{\sqrt{8}}", r"2\sqrt{2}", True),
    _c(
        "root-rationalise", "exact form", r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", True
    ),
    _c("root-short", "exact form", r"\boxed{\sqrt3}", r"\sqrt{3}", True),
    _c("root-wrong", "exact form", r"\boxed{\sqrt{3}}", r"\sqrt{2}", False),
    _c("root-cube", "exact form", r"\boxed{\sqrt[3]{27}}", "3", True),
    _c("root-decimal", "exact form", r"\boxed{1.414}", r"\sqrt{2}", False),
    _c("pi-times", "exact form", r"\boxed{2\pi}", r"2 \pi", True),
    _c("pi-approx", "exact form", r"\boxed{3.14}", r"\pi", False),
    _c("pi-frac", "exact form", r"\boxed{\frac{\pi}{2}}", r"\frac{1}{2}\pi", True),
    _c("pi-not-unit", "exact form", r"\boxed{2\pi}", "2", False),
    _c("e-euler", "exact form", r"\boxed{e^2}", r"e^{2}", True),
    _c("log-eval", "exact form", r"\boxed{\log_2 8}", "3", True),
    _c("ln-eval", "exact form", r"\boxed{\ln e^3}", "3", True),
    _c("trig-eval", "exact form", r"\boxed{\sin\frac{\pi}{6}}", r"\frac{1}{2}", True),
    _c("trig-wrong", "exact form", r"\boxed{\cos\frac{\pi}{6}}", r"\frac{1}{2}", False),
    _c("factorial", "exact form", r"\boxed{5!}", "120", True),
    _c("binomial", "exact form", r"\boxed{\binom{5}{2}}", "10", True),
    _c("power", "exact form", r"\boxed{2^{10}}", "1024", True),
    # --- LaTeX forms
    _c("latex-left-right", "LaTeX form", r"\boxed{\left( 3 \right)}", "3", True),
    _c("latex-braces", "LaTeX form", r"\boxed{{42}}", "42", True),
    _c("latex-display", "LaTeX form", r"Answer: \[ \frac{3}{8} \]", "0.375", True),
    _c("latex-paren-math", "LaTeX form", r"Answer: \(  -\frac{1}{2} \)", "-0.5", True),
    _c("latex-bold-answer", "LaTeX form", r"**Final Answer:** $-0.50$", r"-\frac{1}{2}", True),
    _c("latex-mathrm", "LaTeX form", r"\boxed{\mathrm{Yes}}", "yes", True),
    _c("latex-boxed-gold", "LaTeX form", "Answer: 7", r"\boxed{7}", True),
    _c("latex-cdot", "LaTeX form", r"\boxed{3 \cdot 4}", "12", True),
    _c("latex-times", "LaTeX form", r"\boxed{6 \times 7}", "42", True),
    _c("latex-superscript", "LaTeX form", "Answer: x²", "x^2", True),
    _c("latex-last-box", "LaTeX form", r"\boxed{1} no wait, \boxed{2}", "2", True),
    _c("latex-last-box-wrong", "LaTeX form", r"\boxed{2} no wait, \boxed{1}", "2", False),
    # --- units
    _c("unit-text", "unit", r"\boxed{12 \text{ cm}}", "12", True),
    _c("unit-text-tight", "unit", r"\boxed{12\text{cm}}", "12", True),
    _c("unit-word", "unit", "Answer: 42 apples", "42", True),
    _c("unit-mbox", "unit", r"\boxed{5\mbox{ m}}", "5", True),
    _c("unit-squared", "unit", r"\boxed{16 \text{ cm}^2}", "16", True),
    _c("unit-wrong-number", "unit", r"\boxed{13 \text{ cm}}", "12", False),
    _c("unit-convert", "unit", r"\boxed{1.2 \text{ m}}", r"120 \text{ cm}", True),
    _c("unit-hours", "unit", "Answer: 3 hours", "3", True),
    _c("unit-plain-words", "unit", "Answer: 7 in total", "7", True),
    _c("unit-words-wrong", "unit", "Answer: 8 dogs", "7", False),
    _c("unit-math-word", "unit", "Answer: 2 pi", "2", False),
    _c("unit-degree", "unit", r"\boxed{90^\circ}", "90", True),
    _c("unit-degree-braced", "unit", r"\boxed{90^{\circ}}", "90", True),
    _c("unit-degree-sign", "unit", r"\boxed{90°}", "90", True),
    _c("unit-degree-radian", "unit", r"\boxed{30^\circ}", r"\frac{\pi}{6}", True),
    _c("unit-degree-wrong", "unit", r"\boxed{60^\circ}", "30", False),
    # --- percentages
    _c("pct-percent", "percentage", r"\boxed{25\%}", "25", True),
    _c("pct-fraction", "percentage", r"\boxed{25\%}", r"\frac{1}{4}", True),
    _c("pct-decimal", "percentage", r"\boxed{0.25}", r"25\%", True),
    _c("pct-plain-sign", "percentage", "Answer: 25%", "25", True),
    _c("pct-wrong", "percentage", r"\boxed{2.5\%}", "25", False),
    _c("pct-gold-sign", "percentage", r"\boxed{40}", r"40\%", True),
    _c("pct-word", "percentage", r"\boxed{40 \text{ percent}}", "40", True),
    # --- intervals
    _c("int-closed", "interval", r"\boxed{[1, 2]}", r"\left[ 1, 2 \right]", True),
    _c("int-half-open", "interval", r"\boxed{[1,2)}", "[1, 2)", True),
    _c("int-open-vs-closed", "interval", r"\boxed{(1,2)}", "[1,2]", False),
    _c("int-endpoint", "interval", r"\boxed{[1,3)}", "[1,2)", False),
    _c("int-infinity", "interval", r"\boxed{(-\infty, 3]}", r"(-\infty,3]", True),
    _c("int-inequality", "interval", r"\boxed{x \le 3}", r"(-\infty, 3]", True),
    _c("int-strict-inequality", "interval", r"\boxed{x > 2}", r"(2, \infty)", True),
    _c(
        "int-union",
        "interval",
        r"\boxed{(-\infty,0)\cup(1,\infty)}",
        r"(-\infty,0) \cup (1,\infty)",
        True,
    ),
    _c(
        "int-union-wrong",
        "interval",
        r"\boxed{(-\infty,0]\cup(1,\infty)}",
        r"(-\infty,0)\cup(1,\infty)",
        False,
    ),
    _c("int-double-ineq", "interval", r"\boxed{1 < x < 2}", "(1, 2)", True),
    # --- sets and lists
    _c("set-order", "set", r"\boxed{\{3, 1, 2\}}", r"\{1, 2, 3\}", True),
    _c("set-missing", "set", r"\boxed{\{1, 2\}}", r"\{1, 2, 3\}", False),
    _c("set-extra", "set", r"\boxed{\{1, 2, 3, 4\}}", r"\{1, 2, 3\}", False),
    _c("set-list", "set", "Answer: 1, 2", r"\{1, 2\}", True),
    _c("set-list-order", "set", r"\boxed{-2, 5}", "5, -2", True),
    _c("set-list-wrong", "set", r"\boxed{-2, 4}", "5, -2", False),
    _c("set-fractions", "set", r"\boxed{\{\frac12, 0.25\}}", r"\{\frac14, \frac12\}", True),
    _c("set-empty", "set", r"\boxed{\emptyset}", r"\varnothing", True),
    _c("set-solutions-or", "set", r"\boxed{x = 1 \text{ or } x = 2}", "1, 2", True),
    _c("set-pm", "set", r"\boxed{\pm 3}", "3, -3", True),
    # --- tuples and points
    _c("tuple-same", "tuple", r"\boxed{(1, 2)}", "(1,2)", True),
    _c("tuple-swapped", "tuple", r"\boxed{(2, 1)}", "(1, 2)", False),
    _c("tuple-fraction", "tuple", r"\boxed{(\frac12, 3)}", "(0.5, 3)", True),
    _c("tuple-3d", "tuple", r"\boxed{(1, -1, 2)}", "(1,-1,2)", True),
    _c("tuple-3d-wrong", "tuple", r"\boxed{(1, 1, 2)}", "(1,-1,2)", False),
    _c(
        "tuple-vector",
        "tuple",
        r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}",
        r"\begin{pmatrix}1\\2\end{pmatrix}",
        True,
    ),
    _c(
        "matrix-wrong",
        "tuple",
        r"\boxed{\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}}",
        r"\begin{pmatrix}1&0\\0&2\end{pmatrix}",
        False,
    ),
    # --- equations and expressions
    _c("eq-assignment", "equation", r"\boxed{x = 5}", "5", True),
    _c("eq-subscript", "equation", "Answer: x_1 = 5", "5", True),
    _c("eq-wrong-value", "equation", r"\boxed{x = 4}", "5", False),
    _c("eq-line", "equation", r"\boxed{y = 2x + 1}", "y=1+2x", True),
    _c("eq-line-wrong", "equation", r"\boxed{y = 2x - 1}", "y=2x+1", False),
    _c("eq-function", "equation", r"\boxed{f(x) = 3x^2}", "3x^2", True),
    _c("expr-commute", "equation", r"\boxed{x + 1}", "1+x", True),
    _c("expr-factor", "equation", r"\boxed{(x-1)(x+1)}", "x^2-1", True),
    _c("expr-not-square", "equation", r"\boxed{(x+1)^2}", "x^2+1", False),
    _c("expr-case", "equation", r"\boxed{X + 1}", "x+1", False),
    _c("expr-scaled", "equation", r"\boxed{2x + 2}", "x+1", False),
    _c("expr-trig-identity", "equation", r"\boxed{\sin^2 x + \cos^2 x}", "1", True),
    # --- complex numbers
    _c("cx-order", "complex", r"\boxed{1 + i}", "i+1", True),
    _c("cx-conjugate", "complex", r"\boxed{1 - i}", "1+i", False),
    _c("cx-sqrt-neg", "complex", r"\boxed{2i}", r"\sqrt{-4}", True),
    # --- words
    _c("word-yes", "text", r"\boxed{\text{yes}}", "yes", True),
    _c("word-case", "text", "Answer: Yes", "yes", True),
    _c("word-no", "text", r"\boxed{\text{no}}", "yes", False),
    _c("word-choice", "text", r"\boxed{B}", "B", True),
    _c("word-choice-wrong", "text", r"\boxed{C}", "B", False),
    _c("word-choice-paren", "text", r"\boxed{(B)}", "B", True),
)

KNOWN_DISAGREEMENTS: dict[str, str] = {
    "int-thin-space": r"math-verify reads the thin space in 1\,234 as a plus sign (1 + 234 = "
    "235); in LaTeX it is a thousands separator",
    "int-space-sep": "math-verify reads the spaces of 1 000 000 as products (1*0*0 = 0); SI "
    "style groups thousands with spaces",
    "int-sci-e": "math-verify reads the e of 1e3 as Euler's number (3e); as plain text it is "
    "scientific notation for 1000",
    "int-text-number": r"number words are not parsed: \text{twelve} stays a symbol",
    "frac-7-digits": "math-verify compares decimals rounded to 6 places (float_rounding=6), so "
    "0.3333333 counts as 1/3; it is a truncation, not the value",
    "frac-repeating": r"\overline (a repeating decimal) is not parsed; 0.\overline{3} is 1/3",
    "unit-convert": r"\text{} units are dropped, not converted: 1.2 m is compared as 1.2 "
    "with 120",
    "unit-degree-radian": r"^\circ is dropped, not converted: 30 degrees is compared as 30 "
    "with pi/6",
    "int-inequality": "an inequality answer is not compared with an interval gold answer "
    "(math-verify's allow_set_relation_comp=False: only a set answer is compared with a "
    "relation gold); x <= 3 is the set (-inf, 3]",
    "int-strict-inequality": "as int-inequality: x > 2 is the set (2, inf)",
    "int-double-ineq": "as int-inequality: 1 < x < 2 is the set (1, 2)",
    "set-empty": r"\varnothing is read as a symbol named varnothing, not as the empty set "
    r"(\emptyset is)",
    "expr-case": "math-verify lower-cases the answer, so X + 1 equals x + 1; X and x are "
    "different variables",
    "cx-sqrt-neg": r"\sqrt{-4} is left unevaluated and the i of 2i is a plain symbol, so the "
    "two are not matched; the principal root of -4 is 2i",
}
"""Case id -> why the new reward (math-verify 0.9.0) gives the other verdict."""

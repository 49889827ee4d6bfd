// MathJax 3 settings for the formulas that pymdownx.arithmatex (generic mode) wraps in
// <span class="arithmatex">\(...\)</span> and <div class="arithmatex">\[...\]</div>: typeset those, nothing else.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*", processHtmlClass: "arithmatex"},
};

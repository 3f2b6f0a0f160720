// The one script a page with a "Run live" button loads: a click listener. Nothing else runs until
// the first click, which imports live.mjs (and that starts Pyodide in a Web Worker).
(function () {
  var base = document.currentScript ? document.currentScript.src : "";
  document.addEventListener("click", function (e) {
    var b = e.target && e.target.closest ? e.target.closest(".paged-kv-live-run") : null;
    if (!b || !base) return;
    var box = b.closest(".paged-kv-live");
    import(new URL("live.mjs", base).href).then(function (m) { return m.start(box); }).catch(function (err) {
      var s = box.querySelector(".paged-kv-live-status");
      s.style.display = "";
      s.textContent = "Live mode could not start: " + err;
    });
  });
})();

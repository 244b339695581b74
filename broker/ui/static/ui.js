// Isthmus dashboard: the only script. An opt-in auto-refresh of the current page (every
// 10 s, remembered per browser tab); pages work without it.
(function () {
  "use strict";
  var box = document.getElementById("autorefresh");
  if (!box) { return; }
  var key = "isthmus-autorefresh";
  box.checked = window.sessionStorage.getItem(key) === "1";
  var timer = null;
  function arm() {
    if (timer) { window.clearTimeout(timer); timer = null; }
    if (box.checked) { timer = window.setTimeout(function () { window.location.reload(); }, 10000); }
  }
  box.addEventListener("change", function () {
    window.sessionStorage.setItem(key, box.checked ? "1" : "0");
    arm();
  });
  arm();
}());

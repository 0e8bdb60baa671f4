// backfill console: progressive enhancement only; every page works without it.
// An element with data-refresh="<ms>" is re-read from the server (data-refresh-url, else this
// page's URL) and its contents swapped in, unless the keyboard focus is inside it or the tab is
// hidden. Charts are server-rendered SVG, so they refresh with their section.
(function () {
  "use strict";
  function start(el) {
    var ms = parseInt(el.getAttribute("data-refresh"), 10) || 3000;
    var url = el.getAttribute("data-refresh-url") || window.location.href;
    function later() { window.setTimeout(tick, ms); }
    function tick() {
      if (document.hidden || el.contains(document.activeElement)) { later(); return; }
      window.fetch(url, { credentials: "same-origin" })
        .then(function (resp) {
          if (resp.redirected || !resp.ok) { throw new Error("refresh: " + resp.status); }
          return resp.text();
        })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById(el.id);
          if (fresh && !el.contains(document.activeElement)) { el.innerHTML = fresh.innerHTML; }
        })
        .catch(function () { /* keep what is shown; try again later */ })
        .then(later);
    }
    later();
  }
  document.addEventListener("DOMContentLoaded", function () {
    var regions = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < regions.length; i++) { if (regions[i].id) { start(regions[i]); } }
  });
})();

// verinfer explorer: live pages without a reload. Polls /api/status once a second; when the
// index's version moved, fetches this same page and swaps its <main> in. The pages are
// complete without this script (JavaScript off: reload by hand).
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="vi-live"]');
  var badge = document.getElementById("live");
  if (!meta || !window.fetch || !window.DOMParser) { return; }
  var version = meta.getAttribute("content");
  var refreshing = false;

  function setBadge(text, cls) {
    if (badge) { badge.textContent = text; badge.className = cls; }
  }

  function refresh() {
    refreshing = true;
    return fetch(location.pathname + location.search, { headers: { "X-Live": "1" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("main");
        var current = document.querySelector("main");
        if (fresh && current) { current.replaceWith(document.importNode(fresh, true)); }
        var footer = doc.querySelector("footer");
        var oldFooter = document.querySelector("footer");
        if (footer && oldFooter) {
          oldFooter.replaceWith(document.importNode(footer, true));
          badge = document.getElementById("live");
        }
        setBadge("live", "live-on");
      })
      .finally(function () { refreshing = false; });
  }

  function tick() {
    fetch("/api/status", { cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(function (s) {
        setBadge("live", "live-on");
        var v = String(s.version);
        if (v !== version && !refreshing) { version = v; return refresh(); }
      })
      .catch(function () { setBadge("live: server unreachable", "live-err"); })
      .finally(function () { setTimeout(tick, 1000); });
  }

  setBadge("live", "live-on");
  setTimeout(tick, 1000);
})();

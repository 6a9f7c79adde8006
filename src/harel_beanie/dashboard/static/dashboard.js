// The dashboard's only script, served as a file so that the pages' Content-Security-Policy
// can forbid inline scripts and event handlers. Behaviour reads data- attributes: a value
// from an execution (its id, say) reaches this script as an attribute the browser has
// already decoded, and is only ever shown as text, never evaluated.
"use strict";

// A form with data-confirm asks before it is sent; the question is shown as plain text.
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form && form.getAttribute ? form.getAttribute("data-confirm") : null;
  if (question !== null && !window.confirm(question)) {
    event.preventDefault();
  }
});

// The execution page's statechart: its Mermaid source is text in the page (put there by the
// server, escaped), drawn here with the vendored mermaid.min.js in strict mode (no HTML
// labels, no click handlers). The drawing is parsed as SVG (an XML document, where nothing
// runs) and its nodes adopted: this script never writes markup into the page as HTML.
//
// The page's policy admits no inline style, and mermaid writes its look as inline style: a
// style attribute on most shapes and a <style> element in the drawing. The browser would
// refuse each one, logging a policy violation on the console every time (hundreds a drawing,
// counting the copies mermaid parses again to sanitise them). So while mermaid draws, those
// writes are left out where mermaid makes them (withoutInlineStyle); the browser never sees
// an inline style, and dashboard.css gives the drawing its look. What the policy refused
// before is exactly what is left out now, so the drawing is laid out as it was.
var drawings = 0;

function withoutInlineStyle(draw) {
  var setAttribute = Element.prototype.setAttribute;
  var setAttributeNS = Element.prototype.setAttributeNS;
  var createElement = document.createElement;
  Element.prototype.setAttribute = function (name, value) {
    if (String(name).toLowerCase() !== "style") {
      setAttribute.call(this, name, value);
    }
  };
  Element.prototype.setAttributeNS = function (namespace, name, value) {
    if (String(name).toLowerCase() !== "style") {
      setAttributeNS.call(this, namespace, name, value);
    }
  };
  // mermaid fills a <style> element with its theme's rules and puts it in the drawing: it
  // gets a comment instead, which holds no rules and applies none
  document.createElement = function (name) {
    if (String(name).toLowerCase() === "style") {
      return document.createComment("style");
    }
    return createElement.apply(document, arguments);
  };
  function restore() {
    Element.prototype.setAttribute = setAttribute;
    Element.prototype.setAttributeNS = setAttributeNS;
    document.createElement = createElement;
  }
  try {
    return Promise.resolve(draw()).finally(restore);
  } catch (error) {
    restore();
    return Promise.reject(error);
  }
}

function svgOf(text) {
  var parsed = new DOMParser().parseFromString(text, "image/svg+xml");
  var root = parsed.documentElement;
  if (!root || root.nodeName !== "svg" || parsed.getElementsByTagName("parsererror").length > 0) {
    throw new Error("the drawing is not an SVG document");
  }
  return document.importNode(root, true);
}

// Mermaid gives its drawing width="100%" and keeps its own size in an inline max-width
// style, which is left out above: the drawing would then be stretched to the page's width,
// and a narrow chart of four states drawn 2,000 px tall. So the drawing gets its own size
// back as attributes, scaled down to fit MAX_CHART_HEIGHT (but not below half, where its
// labels would be too small to read: a chart that large scrolls in its box instead).
var MAX_CHART_HEIGHT = 560;

function sized(svg) {
  var box = (svg.getAttribute("viewBox") || "").trim().split(/[\s,]+/).map(Number);
  if (box.length === 4 && box[2] > 0 && box[3] > 0) {
    var scale = Math.max(0.5, Math.min(1, MAX_CHART_HEIGHT / box[3]));
    svg.setAttribute("width", String(Math.round(box[2] * scale)));
    svg.setAttribute("height", String(Math.round(box[3] * scale)));
  }
  return svg;
}

function drawStatechart() {
  var source = document.getElementById("statechart-source");
  var target = document.getElementById("statechart");
  if (!source || !target || typeof window.mermaid === "undefined") {
    return;
  }
  window.mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "neutral", htmlLabels: false });
  drawings += 1;
  var id = "statechart-svg-" + drawings;
  withoutInlineStyle(function () {
    return window.mermaid.render(id, source.textContent);
  }).then(function (result) {
    target.replaceChildren(sized(svgOf(result.svg)));
    target.setAttribute("data-drawn", "true");
  }).catch(function (error) {
    target.textContent = "The statechart could not be drawn: " + String(error);
    target.setAttribute("data-drawn", "failed");
  });
}

document.addEventListener("DOMContentLoaded", drawStatechart);

// Live pages (see harel_beanie/dashboard/live.py): the server says "changed" on one
// EventSource per page; the page fetches itself again and swaps in each element marked
// data-live (by id), leaving forms being typed into alone. Closed while the tab is hidden.
var liveSource = null;
var refreshing = false;

function refreshLive() {
  if (refreshing) {
    return;
  }
  refreshing = true;
  fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
    .then(function (response) { return response.ok ? response.text() : null; })
    .then(function (html) {
      if (html === null) {
        return;
      }
      var fresh = new DOMParser().parseFromString(html, "text/html");
      document.querySelectorAll("[data-live][id]").forEach(function (element) {
        var replacement = fresh.getElementById(element.id);
        if (replacement) {
          element.replaceWith(document.importNode(replacement, true));
        }
      });
      if (document.getElementById("statechart-source")) {
        drawStatechart();  // its section was swapped in undrawn (its source may be the same)
      }
    })
    .catch(function () { /* the next change tries again */ })
    .then(function () { refreshing = false; });
}

function openLive() {
  var url = document.body.getAttribute("data-live-url");
  if (!url || liveSource !== null || typeof window.EventSource === "undefined") {
    return;
  }
  liveSource = new EventSource(url);
  liveSource.addEventListener("changed", refreshLive);
  var state = document.getElementById("live-state");
  if (state) {
    state.textContent = " · live";
  }
}

function closeLive() {
  if (liveSource !== null) {
    liveSource.close();
    liveSource = null;
  }
}

document.addEventListener("visibilitychange", function () {
  if (document.hidden) {
    closeLive();
  } else {
    refreshLive();
    openLive();
  }
});

document.addEventListener("DOMContentLoaded", function () {
  if (!document.hidden) {
    openLive();
  }
});

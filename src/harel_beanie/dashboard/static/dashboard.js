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

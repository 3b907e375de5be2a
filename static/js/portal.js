// Small progressive enhancements; everything works without JavaScript.

// The Content-Security-Policy allows no inline <style> and no eval: htmx must
// neither inject its indicator style nor evaluate hx-on/js: attributes. This runs
// before htmx initialises (both scripts are deferred, htmx first).
if (window.htmx) {
  window.htmx.config.includeIndicatorStyles = false;
  window.htmx.config.allowEval = false;
}

document.addEventListener("change", (event) => {
  const target = event.target;
  if (target instanceof HTMLSelectElement && target.dataset.autosubmit !== undefined) {
    target.form.submit();
  }
});

// Ask before an action that cannot be undone (cancelling a running job, draining a node):
// a form with data-confirm="question" submits only once the member says yes.
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});

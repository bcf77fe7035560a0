// The dashboard's one script, served from our own origin so that the Content-Security-Policy
// forbids every inline script and eval (htmx's trigger filters use eval; this replaces them).
//
// An element marked data-poll-visible polls (hx-trigger="every Ns") only while its tab is
// visible: a request it starts in a hidden tab is cancelled before it leaves.
document.addEventListener("htmx:beforeRequest", (event) => {
  const source = event.detail.elt;
  if (source && source.hasAttribute("data-poll-visible") && document.visibilityState !== "visible") {
    event.preventDefault();
  }
});

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

// A poll never replaces a form a person is editing. Forms in a polled region sit in an element
// marked hx-preserve (htmx keeps the very element, with its text, focus and open state); this is
// the net under any that does not: while a posting form's field has focus or differs from what
// the page gave it, the poll's answer is dropped and the next one tries again.
function beingEdited(field) {
  if (field === document.activeElement) {
    return true;
  }
  if (field.type === "checkbox" || field.type === "radio") {
    return field.checked !== field.defaultChecked;
  }
  if (field.tagName === "SELECT") {
    return Array.from(field.options).some((option) => option.selected !== option.defaultSelected);
  }
  return field.type !== "hidden" && field.value !== field.defaultValue;
}

// A poll keeps the keyboard's place and the page's scroll: the swap replaces the focused link
// with its twin, and htmx gives the focus back only to an element with an id. Each focusable
// element is known by a stable key (its id, else what it is and where it goes), found again in
// the new content and focused, and the page is scrolled back to where the person left it.
const FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";
let keptPlace = null;

function stableKey(element) {
  if (element.id) {
    return `#${element.id}`;
  }
  const what = ["href", "name", "value"].map((name) => element.getAttribute(name));
  return [element.tagName, ...what, element.textContent.trim()].join("\u0000");
}

function twinOf(key, index) {
  const twins = Array.from(document.querySelectorAll(FOCUSABLE)).filter((element) => stableKey(element) === key);
  return twins[Math.min(index, twins.length - 1)];
}

document.addEventListener("htmx:beforeSwap", (event) => {
  const source = event.detail.requestConfig && event.detail.requestConfig.elt;
  if (!source || !source.hasAttribute("data-poll-visible")) {
    return;
  }
  const fields = event.detail.target.querySelectorAll('form[method="post"] :is(input, textarea, select)');
  if (Array.from(fields).some((field) => !field.closest("[hx-preserve]") && beingEdited(field))) {
    event.detail.shouldSwap = false;
    return;
  }
  const active = document.activeElement;
  keptPlace = { x: window.scrollX, y: window.scrollY, key: null, index: 0 };
  if (active && active !== document.body && event.detail.target.contains(active)) {
    keptPlace.key = stableKey(active);
    const same = Array.from(document.querySelectorAll(FOCUSABLE)).filter((e) => stableKey(e) === keptPlace.key);
    keptPlace.index = same.indexOf(active);
  }
});

// Times in the reader's own time zone. The server writes every time once (evidence/i18n.py,
// time_html): <time datetime="…Z" title="… UTC" data-local>… UTC</time>. Here its text becomes
// the same instant in this browser's zone, in the page's language, the UTC staying in the
// tooltip; without JavaScript the page says UTC.
function localTime(element) {
  const instant = new Date(element.getAttribute("datetime"));
  if (Number.isNaN(instant.getTime())) {
    return;
  }
  const chinese = document.documentElement.lang.toLowerCase().startsWith("zh");
  const format = new Intl.DateTimeFormat(chinese ? "zh-Hans" : "en", {
    year: "numeric", month: chinese ? "numeric" : "2-digit", day: chinese ? "numeric" : "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short",
  });
  const part = Object.fromEntries(format.formatToParts(instant).map((p) => [p.type, p.value]));
  const time = `${part.hour}:${part.minute}:${part.second} ${part.timeZoneName}`;
  element.textContent = chinese
    ? `${part.year}年${part.month}月${part.day}日 ${time}`
    : `${part.year}-${part.month}-${part.day} ${time}`;
}

function localTimes(root) {
  root.querySelectorAll("time[data-local]").forEach(localTime);
}

localTimes(document);
document.addEventListener("htmx:load", (event) => localTimes(event.detail.elt));
document.addEventListener("htmx:afterSettle", () => {
  if (!keptPlace) {
    return;
  }
  const place = keptPlace;
  keptPlace = null;
  if (place.key && (!document.activeElement || document.activeElement === document.body)) {
    const twin = twinOf(place.key, place.index);
    if (twin) {
      twin.focus({ preventScroll: true });
    }
  }
  window.scrollTo(place.x, place.y);
});

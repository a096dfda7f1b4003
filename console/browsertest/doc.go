// Package browsertest drives the web console (package console) with a real
// browser: Debian's chromium, headless, through the Chrome DevTools Protocol
// (chromedp). It holds tests only; chromium missing is a test failure saying
// what to install (.ci/run installs it).
package browsertest

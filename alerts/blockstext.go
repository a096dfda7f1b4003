package alerts

import (
	"encoding/json"
	"fmt"
	"html"
	"strings"
)

// BlocksText renders the Block Kit blocks of a posted message (the
// "blocks" JSON array of a webhook payload or of chat.postMessage) as the
// text on-call reads in Slack: the header, then each section and context,
// buttons as [label], a blank line between blocks, entities (&amp; &lt; &gt;) decoded. It is
// for printing what was posted (the demo, a test listener); it does not
// render mrkdwn beyond that.
func BlocksText(blocks []byte) (string, error) {
	var bs []struct {
		Type string `json:"type"`
		Text *struct {
			Text string `json:"text"`
		} `json:"text"`
		// A context's elements carry their text as a string; an actions
		// block's buttons as a text object.
		Elements []struct {
			Type string          `json:"type"`
			Text json.RawMessage `json:"text"`
		} `json:"elements"`
	}
	if err := json.Unmarshal(blocks, &bs); err != nil {
		return "", fmt.Errorf("read Slack blocks: %w", err)
	}
	var parts []string
	for _, b := range bs {
		var texts []string
		if b.Text != nil {
			texts = append(texts, b.Text.Text)
		}
		for _, e := range b.Elements {
			var text string
			var obj struct {
				Text string `json:"text"`
			}
			switch {
			case json.Unmarshal(e.Text, &text) == nil && text != "":
				texts = append(texts, text)
			case e.Type == "button" && json.Unmarshal(e.Text, &obj) == nil && obj.Text != "":
				texts = append(texts, "["+obj.Text+"]")
			}
		}
		if len(texts) > 0 {
			parts = append(parts, html.UnescapeString(strings.Join(texts, " ")))
		}
	}
	return strings.Join(parts, "\n\n"), nil
}

// MessageText is BlocksText of a rendered Message's blocks.
func MessageText(m Message) string {
	raw, err := json.Marshal(m.Blocks)
	if err != nil {
		return m.Text
	}
	s, err := BlocksText(raw)
	if err != nil || s == "" {
		return m.Text
	}
	return s
}

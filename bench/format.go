package main

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// formatRate writes a rate in whole messages per second with thousands
// separators: 12345.6 is "12,346".
func formatRate(r float64) string {
	return groupThousands(int64(math.Round(r)))
}

func groupThousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if n < 0 {
		sign, s = "-", s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3)
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return sign + string(out)
}

// formatRatio writes a ratio such as 2.31 as "2.31×"; 0 (unknown) as "–".
func formatRatio(r float64) string {
	if r == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", r)
}

// formatPercent writes a fraction such as 0.456 as "46%"; 0 as "–".
func formatPercent(f float64) string {
	if f == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}

// formatBytes writes a byte count in binary units, signed when negative.
func formatBytes(n int64) string {
	const unit = 1024
	abs := n
	if abs < 0 {
		abs = -abs
	}
	if abs < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), "KMGT"
	i := -1
	for math.Abs(v) >= unit && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, suffix[i])
}

// formatDuration rounds a duration for a table: to 1 µs under a
// millisecond, to 0.1 ms under a second, to 1 ms above.
func formatDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

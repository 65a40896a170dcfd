/* kernelperf's additions to asv 0.6.6's dashboard, injected by kernels/bench/dashboard.py
   right after asv.js (its document-ready handler must run after asv.js's, which defines
   $.asv, and before graphdisplay.js's, which registers the graph page).

   - A graph page opened without parameter filters takes the defaults dashboard.py computed
     from the published graphs (index.json's "kernelperf" key): values that have points on
     the machines shown, instead of asv's "first values, up to 8 lines".
   - $.plot is wrapped for the benchmark graph: series without a single point are dropped
     (and left out of the legend), labels shortened to machine and parameters, the legend
     drawn beside the plot instead of over it, the commit axis labelled with commit hashes,
     time and memory in us/ms and kB/MB/GB, other units in plain decimals, a margin so no
     point or bar sits on the frame, bars of one slot side by side (orderBars below).
   - The grid's tiles draw points too: a benchmark with one commit has no line to draw.
   - What the main graph drew is recorded in its data-kernelperf attribute (JSON), which
     kernels.bench.dashboard.graph_facts reads from the page's DOM.
*/
'use strict';

/* flot's "orderBars" option (asv sets series.bars.order): the bars of one x slot side by side,
   each barWidth wide, centred on the slot. The CDN plug-in has no Debian copy; this is the
   same idea in a few lines. Runs after the categories plug-in has turned names into numbers. */
(function ($) {
    function shift(plot, series, datapoints) {
        if (!series.bars || !series.bars.show || series.bars.order == null) {
            return;
        }
        var orders = [];
        $.each(plot.getData(), function (i, s) {
            if (s.bars && s.bars.show && s.bars.order != null) {
                orders.push(s.bars.order);
            }
        });
        orders.sort(function (a, b) { return a - b; });
        var offset = (orders.indexOf(series.bars.order) - (orders.length - 1) / 2) *
            series.bars.barWidth;
        var points = datapoints.points, step = datapoints.pointsize;
        for (var i = 0; i < points.length; i += step) {
            if (points[i] != null) {
                points[i] += offset;
            }
        }
    }
    $.plot.plugins.push({
        init: function (plot) { plot.hooks.processDatapoints.push(shift); },
        options: {series: {bars: {order: null}}},
        name: 'orderBars (kernelperf)',
        version: '1.0'
    });
})(jQuery);

$(document).ready(function () {
    var LEGEND_ID = 'kernelperf-legend';
    var TIME_UNITS = [['ns', 1e-9], ['µs', 1e-6], ['ms', 1e-3], ['s', 1]];
    var BYTE_UNITS = [['B', 1], ['kB', 1e3], ['MB', 1e6], ['GB', 1e9], ['TB', 1e12]];
    var SPREAD_FOR_LOG = 5;
    // A commit hash (8 characters at 12px) and a gap; the y axis' labels beside the plot.
    var TICK_SPACING = 80;
    var Y_LABELS_PX = 70;

    function defaults_for(benchmark) {
        var extra = $.asv.main_json.kernelperf || {};
        return (extra.defaults || {})[benchmark] || null;
    }

    /* `chosen`'s filters that the URL does not set (a user's choice is kept). */
    function take_defaults(params, chosen) {
        $.each(chosen || {}, function (key, values) {
            if (params[key] === undefined) {
                params[key] = values.slice();
            }
        });
    }

    /* Filters the URL does not set come from the defaults: a graph's (values and machines
       with points) and the benchmark list's (the machine with the most benchmarks). The
       regressions page says what its thresholds are, and that there is none, where none. */
    var register_page = $.asv.register_page;
    $.asv.register_page = function (name, show) {
        var show_page = show;
        if (name === 'graphdisplay') {
            show = function (params) {
                take_defaults(params, defaults_for(params.benchmark));
                return show_page(params);
            };
        } else if (name === 'summarylist') {
            show = function (params) {
                take_defaults(params, ($.asv.main_json.kernelperf || {}).list);
                return show_page(params);
            };
        } else if (name === 'regressions') {
            show = function (params) {
                var result = show_page(params);
                watch_regressions();
                return result;
            };
        }
        register_page(name, show);
    };

    function percent(v) {
        return (100 * v).toFixed(v < 0.1 ? 1 : 0) + '%';
    }

    /* asv builds the page's tables when regressions.json arrives, and again on every
       change of branch or grouping: each time, the note on thresholds above them, a line
       where a branch's table is empty, and the rows per branch in data-kernelperf. */
    function annotate_regressions() {
        var body = $('#regressions-body'), main = body.children().first();
        if (!main.length || !main.find('.regression-div').length) {
            return;
        }
        var info = ($.asv.main_json.kernelperf || {}).regressions || {};
        if (!main.find('#kernelperf-thresholds').length) {
            var note = $('<p id="kernelperf-thresholds" style="margin: 8px 0"/>');
            var searched = (info.searched || []).join(' and ');
            if (info.rows) {
                note.append(document.createTextNode(
                    'A step counts when it exceeds its row\'s threshold, from that row\'s ' +
                    'measured noise: ' + info.rows + ' rows of ' + searched + ', ' +
                    percent(info.min) + ' to ' + percent(info.max) + ' (median ' +
                    percent(info.median) + '); each with its reason in '));
                note.append($('<a/>').attr('href', info.file).text(info.file));
                note.append(document.createTextNode(
                    '. Throughput, roofline and speedup (higher is better) and the host ' +
                    'launch cost (never gated) are not searched.'));
            } else {
                note.text('No row has a threshold from measured noise: asv\'s 5% applies.');
            }
            main.prepend(note);
        }
        var branches = $.asv.main_json.params.branch || [null], rows = {};
        main.find('.regression-div').each(function () {
            var div = $(this), table = div.children('table').not('.ignored').first();
            var count = table.find('tbody tr').length;
            var index = parseInt((div.attr('id') || '').replace('regression-div-', ''), 10);
            rows[branches[index] || ''] = count;
            if (!count && !div.children('.kernelperf-none').length) {
                table.after($('<p class="kernelperf-none"/>').text(
                    'No regression: no step in this branch\'s history exceeds its ' +
                    'row\'s threshold.'));
            }
        });
        body.attr('data-kernelperf', JSON.stringify({rows: rows}));
    }

    var regressions_watched = false;
    function watch_regressions() {
        annotate_regressions();
        if (!regressions_watched && window.MutationObserver) {
            regressions_watched = true;
            new MutationObserver(annotate_regressions).observe(
                document.getElementById('regressions-body'), {childList: true, subtree: true});
        }
    }

    function has_points(series) {
        for (var i = 0; i < series.data.length; ++i) {
            var y = series.data[i][1];
            if (y !== null && y !== undefined && isFinite(y)) {
                return true;
            }
        }
        return false;
    }

    function point_count(series) {
        return $.grep(series.data, function (p) {
            return p[1] !== null && p[1] !== undefined && isFinite(p[1]);
        }).length;
    }

    /* asv's label is "key-value; key-value" over every filter that differs between the lines
       (gpu, machine, cpu, ... and the benchmark's parameters). The machine names the device;
       the other machine keys repeat it. */
    function short_label(label, benchmark) {
        var index = $.asv.main_json;
        var param_names = index.benchmarks[benchmark].param_names || [];
        var keys = Object.keys(index.params).concat(param_names, ['commit']);
        keys.sort(function (a, b) { return b.length - a.length; });
        var found = {};
        $.each(label.split('; '), function (i, part) {
            for (var k = 0; k < keys.length; ++k) {
                if (part.indexOf(keys[k] + '-') === 0) {
                    found[keys[k]] = part.slice(keys[k].length + 1);
                    return;
                }
            }
            found[part] = '';
        });
        var words = [];
        $.each(['machine', 'branch'].concat(param_names, ['commit']), function (i, key) {
            if (found[key] !== undefined && !(key === 'commit' && found[key] === 'last')) {
                words.push(key === 'commit' ? 'commit ' + found[key] : found[key]);
            }
        });
        return words.length ? words.join(' · ') : label;
    }

    function pick_unit(units, value) {
        var chosen = units[0];
        $.each(units, function (i, unit) {
            if (Math.abs(value) >= unit[1]) {
                chosen = unit;
            }
        });
        return chosen;
    }

    /* Tick labels with as many decimals as the tick spacing needs: no e-notation. */
    function decimals(step) {
        if (!(step > 0)) {
            return 0;
        }
        return Math.max(0, Math.min(6, -Math.floor(Math.log(step) / Math.LN10 + 1e-9)));
    }

    function plain_formatter(scale) {
        return function (v, axis) {
            return (v / scale).toFixed(decimals(axis.tickSize / scale));
        };
    }

    /* The values' range, within the x range when the user zoomed into one. */
    function y_range(graphs, xaxis) {
        var lo = Infinity, hi = -Infinity;
        var left = xaxis.mode === 'categories' || xaxis.min == null ? -Infinity : xaxis.min;
        var right = xaxis.mode === 'categories' || xaxis.max == null ? Infinity : xaxis.max;
        $.each(graphs, function (i, s) {
            $.each(s.data, function (j, p) {
                if (p[1] !== null && isFinite(p[1]) && !(p[0] < left || p[0] > right)) {
                    lo = Math.min(lo, p[1]);
                    hi = Math.max(hi, p[1]);
                }
            });
        });
        return [lo, hi];
    }

    /* A number as a tick label: at most 3 significant digits, never e-notation. */
    function short_number(v) {
        return String(Number(v.toPrecision(3)));
    }

    /* Powers of ten on the y axis, ticks at 1, 2 and 5 of each decade, labelled in `scale`. */
    function log_axis(y, lo, hi, scale) {
        var log10 = function (v) { return Math.log(v) / Math.LN10; };
        y.transform = function (v) { return v > 0 ? log10(v) : null; };
        y.inverseTransform = function (v) { return Math.pow(10, v); };
        y.min = lo / 1.5;
        y.max = hi * 1.5;
        y.ticks = [];
        for (var d = Math.floor(log10(y.min)); d <= Math.ceil(log10(y.max)); ++d) {
            $.each([1, 2, 5], function (i, m) {
                var v = m * Math.pow(10, d);
                if (v >= y.min && v <= y.max) {
                    y.ticks.push([v, short_number(v / scale)]);
                }
            });
        }
        y.tickFormatter = null;
    }

    /* The y axis in its unit (time and bytes scaled to the largest value), starting at 0 with
       headroom above the top point; on a log scale when asv's log button is on, or when the
       values span more than SPREAD_FOR_LOG (a GPU's microseconds beside a CPU's
       milliseconds), bars too: flot clips a bar's foot (0) to the axis minimum, so a 2 us bar
       beside 350 us ones stays visible instead of a sliver. Reference mode (ratios) stays
       asv's. */
    function y_axis(options, graphs, unit) {
        var y = options.yaxis;
        if ($('#reference').hasClass('active')) {
            return;
        }
        var range = y_range(graphs, options.xaxis), lo = range[0], hi = range[1];
        if (!isFinite(lo)) {
            return;
        }
        var scale = 1, label = unit && unit !== 'unit' ? unit : '';
        if (unit === 'seconds') {
            var time = pick_unit(TIME_UNITS, hi);
            scale = time[1];
            label = time[0];
        } else if (unit === 'bytes') {
            var size = pick_unit(BYTE_UNITS, hi);
            scale = size[1];
            label = size[0];
        }
        var zoom = $('#zoom-y-axis').hasClass('active');
        var spread = lo > 0 && hi / lo > SPREAD_FOR_LOG && !zoom;
        if (lo > 0 && (y.transform || spread)) {
            log_axis(y, lo, hi, scale);
            y.axisLabel = label + ', log scale';
            return;
        }
        delete y.transform;
        delete y.inverseTransform;
        delete y.ticks;
        if (zoom) {
            var pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 1;
            y.min = lo - pad;
            y.max = hi + pad;
        } else {
            y.min = Math.min(0, lo * 1.1);
            y.max = hi > 0 ? hi * 1.15 : 1;
        }
        y.axisLabel = label;
        y.tickFormatter = plain_formatter(scale);
    }

    /* Of the revisions (ascending), those to label on an axis `width` pixels wide, at
       `position` (revision -> axis units, from..to): the newest always, then each older one
       at least TICK_SPACING pixels left of the last one kept, so hashes never overlap however
       the commits cluster (a CPU's HEAD far right of the GPUs' history). */
    function spaced_ticks(revisions, position, from, to, width) {
        var kept = [], right = Infinity;
        for (var i = revisions.length - 1; i >= 0; --i) {
            var px = (position(revisions[i]) - from) / (to - from) * width;
            if (right - px >= TICK_SPACING) {
                kept.unshift(revisions[i]);
                right = px;
            }
        }
        return kept;
    }

    /* The commit axis: revisions as x; ticks at the commits that have points, labelled with
       their hashes (spaced_ticks), and a margin at each end. */
    function commit_axis(options, graphs, width) {
        var x = options.xaxis, revisions = [];
        $.each(graphs, function (i, s) {
            $.each(s.data, function (j, p) {
                if (p[1] !== null && isFinite(p[1]) && revisions.indexOf(p[0]) === -1) {
                    revisions.push(p[0]);
                }
            });
        });
        revisions.sort(function (a, b) { return a - b; });
        if (!revisions.length) {
            return;
        }
        x.tickFormatter = null;
        x.axisLabel = 'commit';
        var first = revisions[0], last = revisions[revisions.length - 1];
        var position = function (v) { return v; };
        if (x.transform) {  // even spacing: commit index; keep a margin outside the data
            var to_index = x.transform, to_value = x.inverseTransform;
            x.transform = function (v) {
                return v < first ? -0.5 : v > last ? revisions.length - 0.5 : to_index(v);
            };
            x.inverseTransform = function (v) {
                return v < 0 ? first : v > revisions.length - 1 ? last : to_value(v);
            };
            position = x.transform;
            if (x.min == null && x.max == null) {
                x.min = first - 1;
                x.max = last + 1;
            }
        } else if (x.min == null && x.max == null) {
            var pad = Math.max((last - first) * 0.04, 0.5);
            x.min = first - pad;
            x.max = last + pad;
        }
        // Zoomed in (asv's selection sets min and max): only the commits in view.
        var shown = $.grep(revisions, function (v) {
            return !(x.min != null && v < x.min) && !(x.max != null && v > x.max);
        });
        var from = position(x.min != null ? x.min : first);
        var to = position(x.max != null ? x.max : last);
        if (!(to > from)) {
            to = from + 1;
        }
        x.ticks = $.map(spaced_ticks(shown, position, from, to, width - Y_LABELS_PX),
                        function (v) { return [[v, $.asv.get_commit_hash(v) || '']]; });
    }

    /* Bars: slots in the order of the benchmark's parameter values (flot would order them
       by first appearance), every slot whole inside the frame, bars 0.8 of a slot together. */
    function category_axis(options, graphs) {
        var slots = [];
        $.each(graphs, function (i, s) {
            $.each(s.data, function (j, p) {
                if (p[1] !== null && isFinite(p[1]) && slots.indexOf(p[0]) === -1) {
                    slots.push(p[0]);
                }
            });
        });
        var order = graphs.length ? $.map(graphs[0].data, function (p) { return p[0]; }) : [];
        slots.sort(function (a, b) { return order.indexOf(a) - order.indexOf(b); });
        options.xaxis.categories = slots;
        options.xaxis.min = -0.5;
        options.xaxis.max = slots.length - 0.5;
        options.series.bars.barWidth = 0.8 / Math.max(1, graphs.length);
        $.each(graphs, function (i, s) {  // side by side in the legend's order
            s.bars = $.extend({}, s.bars, {order: i});
        });
    }

    /* The legend as a column beside the plot, sized to its longest label. */
    function place_legend(placeholder, options, graphs) {
        var frame = placeholder.parent(), graph = frame.parent();
        var overview = $('#overview').parent();
        var legend = $('#' + LEGEND_ID);
        if (!legend.length) {
            legend = $('<div id="' + LEGEND_ID + '"/>').css({
                position: 'absolute', top: frame.css('top'), right: 0, bottom: '100px',
                overflow: 'auto', 'font-size': '12px'});
            graph.append(legend);
        }
        if (!options.legend.show || !graphs.length) {
            legend.hide().empty();
            frame.css('right', 0);
            overview.css('right', 0);
            return;
        }
        var longest = 0;
        $.each(graphs, function (i, s) { longest = Math.max(longest, s.label.length); });
        var width = Math.round(Math.min(Math.max(120, longest * 6 + 30),
                                        graph.width() * 0.4));
        legend.css('width', width + 'px').show();
        frame.css('right', (width + 12) + 'px');
        overview.css('right', (width + 12) + 'px');
        options.legend.container = legend;
    }

    /* A grid tile: points as well as lines (one commit draws no line), inside the frame. */
    function summary_tile(options, points) {
        var xs = [], hi = -Infinity;
        $.each(points, function (i, p) {
            if (p[1] !== null && isFinite(p[1])) {
                xs.push(p[0]);
                hi = Math.max(hi, p[1]);
            }
        });
        options.series = $.extend(true, options.series || {}, {points: {show: true, radius: 2}});
        if (!xs.length) {
            return;
        }
        var first = Math.min.apply(null, xs), last = Math.max.apply(null, xs);
        var pad = Math.max((last - first) * 0.05, 0.5);
        options.xaxis = $.extend(options.xaxis || {}, {min: first - pad, max: last + pad});
        options.yaxis = $.extend(options.yaxis || {}, {max: hi > 0 ? hi * 1.25 : 1});
    }

    function record(placeholder, graphs, hidden, options) {
        placeholder.attr('data-kernelperf', JSON.stringify({
            series: $.map(graphs, function (s) {
                return {label: s.label, points: point_count(s)};
            }),
            hidden_empty: hidden,
            xaxis: options.xaxis.axisLabel || '',
            yaxis: options.yaxis.axisLabel || ''
        }));
    }

    var plot = $.plot;
    function kernelperf_plot(placeholder, data, options) {
        placeholder = $(placeholder);
        var id = placeholder.attr('id') || '';
        var benchmark = ($.asv.main_json.benchmarks || {})[$('#title').text()] ?
            $('#title').text() : null;
        options = $.extend(true, {}, options || {});
        if ((id === 'main-graph' || id === 'overview') && benchmark && data) {
            var kept = $.grep(data, has_points);
            var hidden = data.length - kept.length;
            kept = $.map(kept, function (s) {
                return $.extend({}, s, {label: short_label(s.label || '', benchmark)});
            });
            kept.sort(function (a, b) { return a.label < b.label ? -1 : a.label > b.label ? 1 : 0; });
            if (id === 'main-graph') {
                var unit = $.asv.main_json.benchmarks[benchmark].unit;
                // The legend first: it narrows the plot, which the commit ticks are spaced in.
                place_legend(placeholder, options, kept);
                if (options.xaxis.mode === 'categories') {
                    category_axis(options, kept);
                } else if (options.xaxis.axisLabel === 'commits') {
                    commit_axis(options, kept, placeholder.width());
                } else if (options.xaxis.mode === 'time') {
                    options.xaxis.autoscaleMargin = 0.04;
                }
                y_axis(options, kept, unit);
                record(placeholder, kept, hidden, options);
            }
            data = kept;
        } else if (id.indexOf('summarygrid-') === 0 && data && data.length) {
            summary_tile(options, data[0].data || []);
        }
        return plot(placeholder, data, options);
    }
    $.each(plot, function (key, value) {  // $.plot.plugins, version, formatDate, ...
        kernelperf_plot[key] = value;
    });
    $.plot = kernelperf_plot;
});

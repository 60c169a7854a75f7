package turngym.lucene;

import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Runs an Anserini search and returns every hit of the batch as ONE string, so that Python pays
 * one JNI call per batch instead of four per hit.
 *
 * <p>Anserini and Lucene are reached by reflection, so this file compiles against the JDK alone
 * (any javac with {@code --release 11}) whatever Java version the Anserini jar was built for.
 *
 * <p>Encoding: the first character is a separator that occurs in no field; the rest, split on it,
 * is n hit counts (one per query, in order), then for the H hits of all queries in order H docids,
 * H scores, H titles, H texts, and last one field listing (comma-separated) the hits whose stored
 * document only Python may read: not a JSON object, a used field that is not a string, an escape
 * that Python keeps as a lone surrogate, and so on. For those the title field holds the raw
 * stored document and the text field is empty; for all others title and text are exactly what
 * turngym's Python {@code parse_raw} gives. The docid is the document's own "id" string where it
 * has one, else Anserini's docid. A score is the Java float widened to double and printed by
 * {@link Double#toString(double)}, which Python's {@code float()} reads back to the same double.
 */
public final class BatchHits {
  private static final String RAW = "raw";

  private BatchHits() {}

  /** Anserini's {@code batch_search} on the non-empty queries; an empty query gets no hits. */
  public static String search(Object searcher, String[] queries, int k, int threads) throws Throwable {
    List<String> live = new ArrayList<>();
    List<String> ids = new ArrayList<>();
    for (int i = 0; i < queries.length; i++) {
      if (queries[i] != null && !queries[i].isEmpty()) {
        live.add(queries[i]);
        ids.add(Integer.toString(i));
      }
    }
    Object[][] perQuery = new Object[queries.length][];
    if (!live.isEmpty()) {
      Method m = searcher.getClass().getMethod("batch_search", List.class, List.class, int.class, int.class);
      Map<?, ?> results = (Map<?, ?>) invoke(m, searcher, live, ids, k, threads);
      for (String id : ids) {
        perQuery[Integer.parseInt(id)] = (Object[]) results.get(id);
      }
    }
    return encode(perQuery, threads);
  }

  /** Anserini's single-query {@code search(query, k)}. */
  public static String searchOne(Object searcher, String query, int k) throws Throwable {
    Method m = searcher.getClass().getMethod("search", String.class, int.class);
    return encode(new Object[][] {(Object[]) invoke(m, searcher, query, k)}, 1);
  }

  private static Object invoke(Method m, Object target, Object... args) throws Throwable {
    try {
      return m.invoke(target, args);
    } catch (InvocationTargetException e) {
      throw e.getCause();  // Anserini's own exception, not the reflection wrapper
    }
  }

  private static String encode(Object[][] perQuery, int threads) throws Throwable {
    int total = 0;
    for (Object[] hits : perQuery) {
      total += hits == null ? 0 : hits.length;
    }
    Object[] all = new Object[total];
    int at = 0;
    for (Object[] hits : perQuery) {
      for (int i = 0; hits != null && i < hits.length; i++) {
        all[at++] = hits[i];
      }
    }
    Columns cols = new Columns(all);
    cols.fill(threads);
    char sep = separator(cols);
    StringBuilder head = new StringBuilder();
    head.append(sep);
    for (Object[] hits : perQuery) {
      head.append(hits == null ? 0 : hits.length).append(sep);
    }
    StringBuilder rawHits = new StringBuilder();
    for (int i = 0; i < total; i++) {
      if (cols.handedBack[i]) {
        rawHits.append(rawHits.length() > 0 ? "," : "").append(i);
      }
    }
    int size = head.length() + rawHits.length() + 4 * total;
    for (int i = 0; i < total; i++) {
      size += cols.docids[i].length() + cols.scores[i].length() + cols.titles[i].length() + cols.texts[i].length();
    }
    char[] buf = new char[size];
    int p = head.length();
    head.getChars(0, p, buf, 0);
    for (String[] col : new String[][] {cols.docids, cols.scores}) {
      for (String f : col) {
        f.getChars(0, f.length(), buf, p);
        p += f.length();
        buf[p++] = sep;
      }
    }
    for (Piece[] col : new Piece[][] {cols.titles, cols.texts}) {
      for (Piece f : col) {
        f.src.getChars(f.from, f.to, buf, p);
        p += f.length();
        buf[p++] = sep;
      }
    }
    rawHits.getChars(0, rawHits.length(), buf, p);
    return new String(buf);
  }

  /** The four output columns of every hit, read and parsed on up to {@code threads} threads. */
  private static final class Columns {
    final Object[] hits;
    final String[] docids;
    final String[] scores;
    final Piece[] titles;
    final Piece[] texts;
    final boolean[] handedBack;  // stored documents left for Python's parse (the title holds them)
    private Field docidF;
    private Field scoreF;
    private Field docF;
    private volatile Throwable failure;

    Columns(Object[] hits) {
      this.hits = hits;
      int n = hits.length;
      docids = new String[n];
      scores = new String[n];
      titles = new Piece[n];
      texts = new Piece[n];
      handedBack = new boolean[n];
    }

    void fill(int threads) throws Throwable {
      if (hits.length == 0) {
        return;
      }
      Class<?> c = hits[0].getClass();
      docidF = c.getField("docid");
      scoreF = c.getField("score");
      docF = c.getField("lucene_document");
      int workers = Math.max(1, Math.min(threads, hits.length / 256));
      Thread[] started = new Thread[workers - 1];
      for (int w = 1; w < workers; w++) {
        int lo = hits.length * w / workers;
        int hi = hits.length * (w + 1) / workers;
        started[w - 1] = new Thread(() -> range(lo, hi));
        started[w - 1].start();
      }
      range(0, hits.length / workers);
      for (Thread t : started) {
        t.join();
      }
      if (failure != null) {
        throw failure;
      }
    }

    private void range(int lo, int hi) {
      try {
        Method get = null;
        for (int i = lo; i < hi; i++) {
          Object h = hits[i];
          String docid = (String) docidF.get(h);
          docids[i] = docid == null ? "" : docid;
          scores[i] = Double.toString(scoreF.getFloat(h));
          titles[i] = new Piece();
          texts[i] = new Piece();
          Object doc = docF.get(h);
          if (doc == null) {
            continue;
          }
          if (get == null) {
            get = doc.getClass().getMethod("get", String.class);
          }
          String raw = (String) get.invoke(doc, RAW);
          if (raw == null || raw.isEmpty()) {
            continue;
          }
          Doc parsed = RawDoc.parse(raw);
          if (parsed == null) {
            titles[i].set(raw, 0, raw.length());
            handedBack[i] = true;
          } else {
            if (parsed.id != null) {
              docids[i] = parsed.id;
            }
            titles[i] = parsed.title;
            texts[i] = parsed.text;
          }
        }
      } catch (Throwable e) {
        failure = e;  // rethrown by fill() on the calling thread
      }
    }
  }

  /** The first character from U+0001 up that no field contains (never a digit or a comma, which the
   * counts and the list of handed-back hits use). */
  static char separator(Columns cols) {
    for (char c = '\u0001'; c < '\ud800'; c++) {
      if (c == ',' || (c >= '0' && c <= '9') || used(c, cols)) {
        continue;
      }
      return c;
    }
    throw new IllegalStateException("no free separator character");
  }

  private static boolean used(char c, Columns cols) {
    for (int i = 0; i < cols.hits.length; i++) {
      if (cols.docids[i].indexOf(c) >= 0 || cols.scores[i].indexOf(c) >= 0 || cols.titles[i].contains(c)
          || cols.texts[i].contains(c)) {
        return true;
      }
    }
    return false;
  }

  /** Every BMP character that Python's {@code str.isspace()} accepts (for tests). */
  public static String pythonSpaces() {
    StringBuilder sb = new StringBuilder();
    for (char c = 0; c < '\ud800'; c++) {
      if (RawDoc.isPySpace(c)) {
        sb.append(c);
      }
    }
    return sb.toString();
  }

  /** What {@link RawDoc#parse} makes of one stored document: {id or null, title, text}, or null
   * where Python must parse it (for tests). */
  public static String[] parseRaw(String raw) {
    Doc d = RawDoc.parse(raw);
    return d == null ? null : new String[] {d.id, d.title.toString(), d.text.toString()};
  }

  /**
   * A strict JSON reader for one stored document that keeps only what turngym's {@code parse_raw}
   * reads ("id", "title", "text", "contents") and gives up (null) wherever Python's {@code json}
   * and {@code str()} could answer differently: invalid JSON, a top level that is not an object,
   * a used field that is not a string, an escaped surrogate that is not a pair, deep nesting,
   * very long numbers.
   */
  static final class RawDoc {
    private static final int ABSENT = 0;
    private static final int STRING = 1;
    private static final int NULL = 2;
    private static final int OTHER = 3;
    private static final int MAX_DEPTH = 200;
    private static final int MAX_NUMBER = 1000;
    private static final String[] KEYS = {"id", "title", "text", "contents"};

    private final String s;
    private int pos;
    private boolean escaped;  // whether the last string read had an escape
    private final int[] kinds = new int[4];
    private final int[] starts = new int[4];  // opening quote of each used string
    private final int[] ends = new int[4];  // closing quote
    private final boolean[] plain = new boolean[4];  // no escapes: the value is s[start + 1, end)

    private RawDoc(String s) {
      this.s = s;
    }

    static Doc parse(String raw) {
      RawDoc r = new RawDoc(raw);
      try {
        return r.document();
      } catch (IllegalArgumentException e) {
        return null;
      }
    }

    private Doc document() {
      ws();
      if (pos >= s.length() || s.charAt(pos) != '{') {
        throw bad();
      }
      object(0, true);
      ws();
      if (pos != s.length()) {
        throw bad();
      }
      String id;
      if (kinds[0] == STRING) {
        id = stringAt(0);
      } else if (kinds[0] == ABSENT || kinds[0] == NULL) {
        id = null;
      } else {
        throw bad();
      }
      Doc d = new Doc(id);
      if (kinds[1] != ABSENT && kinds[2] != ABSENT) {
        if (kinds[1] != STRING || kinds[2] != STRING) {
          throw bad();
        }
        piece(1, d.title);
        piece(2, d.text);
        return d;
      }
      if (kinds[3] == ABSENT) {
        return d;  // no contents: empty title and text
      }
      if (kinds[3] != STRING) {
        throw bad();
      }
      Piece c = new Piece();
      piece(3, c);
      // Search-R1's contents: the first line, stripped (Python's str.strip()) less one enclosing quote pair, is the title
      int nl = c.src.indexOf('\n', c.from);
      int firstEnd = nl < 0 || nl >= c.to ? c.to : nl;
      int a = c.from;
      int b = firstEnd;
      while (a < b && isPySpace(c.src.charAt(a))) {
        a++;
      }
      while (b > a && isPySpace(c.src.charAt(b - 1))) {
        b--;
      }
      if (b - a >= 2 && c.src.charAt(a) == '"' && c.src.charAt(b - 1) == '"') {
        a++;  // exactly one enclosing pair, as turngym's Python split_contents
        b--;
      }
      d.title.set(c.src, a, b);
      if (firstEnd < c.to) {
        d.text.set(c.src, firstEnd + 1, c.to);
      }
      return d;
    }

    private String stringAt(int slot) {
      pos = starts[slot];
      return string(true);
    }

    /** A used string field, as a range of the stored document where it has no escapes. */
    private void piece(int slot, Piece out) {
      if (plain[slot]) {
        out.set(s, starts[slot] + 1, ends[slot]);
      } else {
        String v = stringAt(slot);
        out.set(v, 0, v.length());
      }
    }

    private static IllegalArgumentException bad() {
      return new IllegalArgumentException();
    }

    private void ws() {
      while (pos < s.length()) {
        char c = s.charAt(pos);
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
          return;
        }
        pos++;
      }
    }

    private char peek() {
      if (pos >= s.length()) {
        throw bad();
      }
      return s.charAt(pos);
    }

    private void expect(char c) {
      if (peek() != c) {
        throw bad();
      }
      pos++;
    }

    /** An object starting at '{'; at the top level the four keys are recorded (last one wins). */
    private void object(int depth, boolean top) {
      if (depth > MAX_DEPTH) {
        throw bad();
      }
      expect('{');
      ws();
      if (peek() == '}') {
        pos++;
        return;
      }
      while (true) {
        ws();
        String key = string(true);
        ws();
        expect(':');
        ws();
        int slot = top ? slot(key) : -1;
        if (slot >= 0 && peek() == '"') {
          starts[slot] = pos;  // read later, and only if used
          escaped = false;
          string(false);
          ends[slot] = pos - 1;
          plain[slot] = !escaped;
          kinds[slot] = STRING;
        } else if (slot >= 0 && s.startsWith("null", pos)) {
          pos += 4;
          kinds[slot] = NULL;
        } else {
          value(depth + 1);
          if (slot >= 0) {
            kinds[slot] = OTHER;
          }
        }
        ws();
        char c = peek();
        pos++;
        if (c == '}') {
          return;
        }
        if (c != ',') {
          throw bad();
        }
      }
    }

    private static int slot(String key) {
      for (int i = 0; i < KEYS.length; i++) {
        if (KEYS[i].equals(key)) {
          return i;
        }
      }
      return -1;
    }

    private void array(int depth) {
      if (depth > MAX_DEPTH) {
        throw bad();
      }
      expect('[');
      ws();
      if (peek() == ']') {
        pos++;
        return;
      }
      while (true) {
        ws();
        value(depth + 1);
        ws();
        char c = peek();
        pos++;
        if (c == ']') {
          return;
        }
        if (c != ',') {
          throw bad();
        }
      }
    }

    private void value(int depth) {
      char c = peek();
      if (c == '"') {
        string(false);
      } else if (c == '{') {
        object(depth, false);
      } else if (c == '[') {
        array(depth);
      } else if (!literal("null") && !literal("true") && !literal("false") && !literal("NaN")
          && !literal("Infinity") && !literal("-Infinity")) {
        number();
      }
    }

    private boolean literal(String word) {
      if (s.startsWith(word, pos)) {
        pos += word.length();
        return true;
      }
      return false;
    }

    /** -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)? as Python's json reads it. */
    private void number() {
      int start = pos;
      if (peek() == '-') {
        pos++;
      }
      char c = peek();
      if (c == '0') {
        pos++;
      } else if (c >= '1' && c <= '9') {
        digits();
      } else {
        throw bad();
      }
      if (pos < s.length() && s.charAt(pos) == '.') {
        pos++;
        digits();
      }
      if (pos < s.length() && (s.charAt(pos) == 'e' || s.charAt(pos) == 'E')) {
        pos++;
        if (peek() == '+' || peek() == '-') {
          pos++;
        }
        digits();
      }
      if (pos - start > MAX_NUMBER) {
        throw bad();  // Python refuses int strings over 4,300 digits with a ValueError
      }
    }

    private void digits() {
      int start = pos;
      while (pos < s.length() && s.charAt(pos) >= '0' && s.charAt(pos) <= '9') {
        pos++;
      }
      if (pos == start) {
        throw bad();
      }
    }

    /** A JSON string starting at '"', unescaped (or only checked, when not {@code build});
     * control characters and escaped surrogates that do not pair are refused. */
    private String string(boolean build) {
      expect('"');
      StringBuilder sb = null;
      int start = pos;
      String t = s;  // locals, so that the JIT keeps the plain-run loop in registers
      int n = t.length();
      while (true) {
        int i = pos;
        while (i < n) {
          char c = t.charAt(i);
          if (c == '"' || c == '\\' || c < 0x20) {
            break;
          }
          i++;
        }
        pos = i;
        char c = peek();
        if (c == '"') {
          pos++;
          if (!build) {
            return null;
          }
          return sb == null ? t.substring(start, pos - 1) : sb.append(t, start, pos - 1).toString();
        }
        if (c != '\\') {
          throw bad();  // a raw control character: Python's json (strict) refuses it in strings
        }
        escaped = true;
        if (build) {
          if (sb == null) {
            sb = new StringBuilder(pos - start + 64);
          }
          sb.append(t, start, pos);
        }
        pos++;
        char e = peek();
        pos++;
        char low = 0;
        switch (e) {
          case '"': case '\\': case '/': break;
          case 'b': e = '\b'; break;
          case 'f': e = '\f'; break;
          case 'n': e = '\n'; break;
          case 'r': e = '\r'; break;
          case 't': e = '\t'; break;
          case 'u': {
            e = hex4();
            if (Character.isHighSurrogate(e)) {
              if (!t.startsWith("\\u", pos)) {
                throw bad();
              }
              pos += 2;
              low = hex4();
              if (!Character.isLowSurrogate(low)) {
                throw bad();
              }
            } else if (Character.isLowSurrogate(e)) {
              throw bad();
            }
            break;
          }
          default: throw bad();
        }
        if (build) {
          sb.append(e);
          if (low != 0) {
            sb.append(low);
          }
        }
        start = pos;
      }
    }

    private char hex4() {
      if (pos + 4 > s.length()) {
        throw bad();
      }
      int v = 0;
      for (int i = 0; i < 4; i++) {
        int d = Character.digit(s.charAt(pos + i), 16);
        if (d < 0 || s.charAt(pos + i) > 'f') {
          throw bad();  // ASCII hex digits only (Character.digit also takes full-width ones)
        }
        v = v * 16 + d;
      }
      pos += 4;
      return (char) v;
    }

    /** Python's str.isspace() (bidirectional class WS, B or S, or category Zs); all are in the BMP. */
    static boolean isPySpace(char c) {
      return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680
          || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f
          || c == 0x3000;
    }
  }

  /** A range of a string: a field of the answer, copied once, straight into it. */
  static final class Piece {
    String src = "";
    int from;
    int to;

    void set(String src, int from, int to) {
      this.src = src;
      this.from = from;
      this.to = to;
    }

    int length() {
      return to - from;
    }

    boolean contains(char c) {
      int i = src.indexOf(c, from);
      return i >= 0 && i < to;
    }

    @Override
    public String toString() {
      return src.substring(from, to);
    }
  }

  /** A stored document as turngym's Python parse_raw reads it: id (null: Anserini's), title, text. */
  static final class Doc {
    final String id;
    final Piece title = new Piece();
    final Piece text = new Piece();

    Doc(String id) {
      this.id = id;
    }
  }
}

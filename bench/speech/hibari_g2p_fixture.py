"""Expected outputs of hibari-tts 0.2.1's text front end, for the Rust port (crates/g2p).

    python3 bench/speech/hibari_g2p_fixture.py /tmp/hibari [OUT.json]

The argument is the unzipped hibari_tts-0.2.1 wheel (the folder that holds `hibari/`); needs
numpy and onnxruntime (the out-of-vocabulary words go through the package's small ONNX net).
Writes crates/g2p/tests/fixtures/g2p.json unless OUT.json is given:

    {"corpus": [text, ...],
     "us": [[chunk, ...], ...],          # Hibari.phonemize(text) with the American G2P
     "gb": [[chunk, ...], ...],          # ... with the British one
     "split": [{"text": ..., "sentences": [...]}, ...]}   # Hibari.split_sentences

Hibari.phonemize is replicated here (same code as tts.py) so the acoustic model never loads;
it uses the package's own split_sentences, MAX_PHONEMES and clause pattern.
"""
import json
import os
import sys

CORPUS = [
    # plain sentences
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "How are you doing today?",
    "I can't believe it's already Friday!",
    "Please close the door behind you.",
    "They went to the market and bought apples, oranges, and bananas.",
    "Is this the real life, or is this just fantasy?",
    "Whatever happens, we will stay together.",
    "An apple a day keeps the doctor away.",
    "A cat sat on a mat in an old house.",
    "The end of the road is near.",
    "The eagle flew over the ocean.",
    "To be or not to be, that is the question.",
    "I want to go to India to see the Taj Mahal.",
    "He used to live in Paris, but he got used to London.",
    "It was used by millions of people.",
    "The results were by far the best we had seen.",
    "Come in, and sit by the fire.",
    "Am I late? I am sorry, I am.",
    # homographs
    "I read the book yesterday, and I will read another one tomorrow.",
    "Please read this aloud.",
    "They live in a small town, and the concert will be broadcast live.",
    "We watched a live performance last night.",
    "Did you record the record on the new record player?",
    "She will lead the team, and the pipe is made of lead.",
    "The wind was strong, so we had to wind the sails.",
    "Wind the clock before you go to bed.",
    "The bandage was wound around the wound.",
    "He wanted to present the present at the present time.",
    "They refuse to move the refuse.",
    "The dove dove into the bushes.",
    "I object to that object being here.",
    "Close the window; we are close to the station.",
    "A tear rolled down her cheek as she began to tear the letter.",
    "The soldier decided to desert his post in the desert.",
    "Does he know how many does are in the forest?",
    "The content of the letter made him content.",
    "Please minute the meeting; it will only take a minute.",
    "Can you produce the produce by Monday?",
    # numbers
    "I have 3 cats and 12 dogs.",
    "There are 1,234 people here.",
    "The population is 7,900,000,000.",
    "He scored 100 points.",
    "She was born in 1985.",
    "The war ended in 1945, and the treaty was signed in 1919.",
    "In 2005 and 2010 and 2024, things changed.",
    "The year 1900 was not a leap year, but 2000 was.",
    "It happened in 1066.",
    "In 1905 he published four papers.",
    "Pi is approximately 3.14159.",
    "The temperature dropped to -5 degrees.",
    "It costs 0.5 dollars.",
    "The ratio is .75 exactly.",
    "Version 2.0.1 was released.",
    "He finished 1st, she finished 2nd, and they finished 3rd.",
    "This is the 21st century, and the 100th anniversary.",
    "On the 4th of July we watch fireworks.",
    "She came in 22nd out of 101 runners.",
    "The 1990s were great, and so were the '80s.",
    "He was in his 30s.",
    "Room 101 is on floor 3.",
    "Call extension 4021.",
    "The code is 007.",
    "Flight 370 departed at noon.",
    "I counted 1000000 grains of sand.",
    "Numbers like 13, 15, 17, and 19 are odd.",
    "About 45% of people agree, and 12.5% disagree.",
    "The interest rate is 3.75%.",
    "Add 2 + 2 and you get 4.",
    "The score was 3-2 at halftime.",
    "Read pages 10-20 before class.",
    "Mix 1/2 cup of sugar with 3/4 cup of flour.",
    "Only 1/3 of the votes were counted.",
    "Is 5 > 3 and 2 < 4?",
    "Set x = 10 and y ~ 20.",
    # times and dates
    "The meeting is at 3:30 pm.",
    "Wake me up at 7:05 AM, please.",
    "The train leaves at 10:00.",
    "We met at 12:15:30 yesterday.",
    "Dinner is at 6pm and lunch at 12:00 p.m. sharp.",
    "The store opens at 9:00 a.m. every day.",
    "It was January 5, 2020 when it began.",
    "My birthday is on March 3rd.",
    "The deadline is Dec. 31, 2023.",
    "We arrived on the 15th of August.",
    "She left on 12 June and came back on 3 July.",
    "The form is dated 12/25/2019.",
    "The ISO date is 2021-03-14.",
    "He was born on 7/4/76.",
    "Sept. 11 is remembered by many.",
    # currency
    "It costs $5.",
    "The price is $3.50.",
    "That will be $1.01, please.",
    "I only have $0.99.",
    "The house sold for $1.2 million.",
    "The company raised $50M last year.",
    "He paid £20 for the ticket.",
    "It costs €15.50 in Paris.",
    "The book was ¥2000 in Tokyo.",
    "They spent ₹500 on lunch.",
    "She earned 100 USD for the job.",
    "A candy bar is 75¢.",
    "He owes me $1.",
    "The budget is £3.5 billion.",
    "That's $20k a year.",
    # units and symbols
    "The road is 15 km long.",
    "It weighs 2.5 kg.",
    "The file is 300 MB and the drive holds 2 TB.",
    "He ran 26.2 mi in 3 hrs.",
    "It is 72°F outside, about 22 °C.",
    "The angle is 90°.",
    "The car goes 60 mph.",
    "Tom & Jerry is a cartoon.",
    "Email me at john@example.com or visit www.example.com.",
    "Use the #hashtag and #1 spot.",
    "Section § 3 covers it.",
    "The value is ± 5.",
    "It's 5 × 3 ÷ 2.",
    "Press * to continue.",
    "The path is /usr/local/bin.",
    "This is © 2024 Acme.",
    # phone numbers
    "Call me at 555-123-4567.",
    "The number is 867-5309.",
    "Dial 1-800-555-0199 for help.",
    # abbreviations, titles, initials, acronyms
    "Dr. Smith is here.",
    "Mr. and Mrs. Jones live on Elm St. near the park.",
    "St. Paul's Cathedral is in London.",
    "Ms. Davis met Prof. Brown at 5 Main St.",
    "Gen. Patton and Capt. Kirk walked in.",
    "J. K. Rowling wrote many books.",
    "John F. Kennedy was president.",
    "The U.S. and the U.K. signed it.",
    "The FBI and the CIA worked with NASA.",
    "I work at IBM, not at the BBC.",
    "He has a PhD from MIT.",
    "The NFL and NBA are popular.",
    "Send it ASAP, BTW.",
    "The USA is large.",
    "He lives in the US.",
    "It's approx. 5 miles, i.e. a long walk, e.g. two hours.",
    "Apples vs. oranges is a classic debate.",
    "See Fig. 3 and Vol. 2 of the report.",
    "Acme Inc. and Widgets Corp. merged.",
    "King Henry VIII had six wives.",
    "Read Chapter IV before World War II.",
    "Pope John Paul II visited Poland.",
    "It is No. 5 on the list.",
    "etc. and so on.",
    # hyphens, contractions and possessives
    "She is a well-known author.",
    "This is a state-of-the-art facility.",
    "My mother-in-law is visiting.",
    "It was a twenty-one-year-old car.",
    "He's the co-founder of a start-up.",
    "I'd've gone if you'd asked.",
    "They're here, we're there, and you're everywhere.",
    "Don't, won't, can't, shouldn't, wouldn't.",
    "It's John's book, not the Smiths' car.",
    "The children's toys were in James's room.",
    "Y'all ain't seen nothin' yet.",
    "Rock 'n' roll will never die.",
    "Let's go, let's see.",
    "O'Brien and O'Neill went to McDonald's.",
    # quotes and brackets
    "He said, \"I will be there.\"",
    "\u201cWhy not?\u201d she asked.",
    "She called it \u2018amazing\u2019 and left.",
    "The answer (as you know) is forty-two.",
    "Use the [optional] flag {carefully}.",
    "'Single quotes' are tricky.",
    "\"Stop!\" he yelled. \"Now!\"",
    # dashes and ellipses
    "I was going to\u2014well, never mind.",
    "Wait -- what did you say?",
    "The years 2001\u20132005 were busy.",
    "Well... I don't know.",
    "And then\u2026 nothing happened.",
    "Hmm\u2026 let me think.",
    "It's a long - very long - story.",
    "So\u2014where were we?",
    # made-up / rare words (OOV)
    "The zorblax quivered in the flimflurm.",
    "Grobnitz and Pellwathy visited Quandorf.",
    "We ate some snarfleberries with krumbletart.",
    "The glorptastic wibblewobble was unfathomably shnazzy.",
    "Xyloquent bramfizzles outpaced the trundlewhomp.",
    "Vorthanic engines hummed in Zyx.",
    "The kwijibo is a rare animal.",
    "Floopity-doop went the frobnicator.",
    # non-ASCII letters
    "We stayed at a caf\u00e9 in Z\u00fcrich.",
    "The na\u00efve fianc\u00e9e ordered cr\u00e8me br\u00fbl\u00e9e.",
    "\u00c5ngstr\u00f6m units are tiny.",
    "S\u00e3o Paulo and M\u00fcnchen are big cities.",
    "The \u00fcber-cool pi\u00f1ata broke.",
    "Stra\u00dfe means street in German.",
    "Bj\u00f6rk sang at the Fj\u00e4llr\u00e4ven show.",
    "Dvo\u0159\u00e1k composed the New World Symphony.",
    "\u00c9mile Zola wrote novels.",
    # mixed letters and digits
    "The B52 flew over Area 51.",
    "I bought an iPhone 15 and a PS5.",
    "Covid19 and H1N1 were pandemics.",
    "The 3D movie was in 4K.",
    "Meet me at 5th Ave.",
    "The MP3 file is 4MB.",
    "He lives at 221B Baker Street.",
    "My password is abc123xyz.",
    "Take the A1 to the M25.",
    # case and shouting
    "THIS IS VERY IMPORTANT.",
    "Stop SHOUTING at me!",
    "The New York Times reported it.",
    "McDonald's and MacBook are brands.",
    "iPad, eBay, and YouTube are names.",
    # questions, exclamations, misc punctuation
    "Really?! You did that?",
    "Oh no; not again: the sequel.",
    "Yes! No? Maybe.",
    "Wow!!! That's amazing!!!",
    "First, second; third: fourth.",
    "This / that / the other.",
    "Cats, dogs, etc.",
    # links with explicit phonemes
    "[Kokoro](/kˈOkəɹO/) is a model.",
    # long sentences split at clauses
    "When the morning came, the villagers gathered in the square, carrying baskets of bread, jars of honey, "
    "bundles of firewood, and all the tools they could find, because the storm had torn through the valley, "
    "knocking down fences, flooding the fields, scattering the sheep across the hills, and leaving the old "
    "bridge, which had stood for more than two hundred years, broken in half; nobody knew where to begin, "
    "but everyone agreed that they would not rest until the last house was repaired, the last field was "
    "drained, and the last sheep was brought home safely.",
    "In the beginning, there was only silence, a vast and patient silence that stretched across the empty "
    "plains, over the sleeping mountains, through the frozen forests, and down into the deep, dark valleys "
    "where the rivers had not yet learned to sing; then, slowly, almost imperceptibly, a sound began to "
    "grow, a whisper at first, then a murmur, then a steady hum that filled the air with promise, and the "
    "world, which had waited so long, finally woke up\u2014stretching, yawning, blinking at the light\u2014and "
    "began, at last, to speak.",
    "Our quarterly report covers revenue, which grew by 12%, expenses, which fell by 3.5%, headcount, "
    "which rose from 1,200 to 1,450, customer satisfaction, which reached 92%, and several new initiatives, "
    "including the expansion into Europe, the launch of three new products, the renovation of our main "
    "office, the upgrade of our data centers, and the creation of a new training program for managers, "
    "engineers, designers, and sales staff across all regions.",
    "She packed her bags carefully: two pairs of shoes, five shirts, three sweaters, a raincoat, an "
    "umbrella, a toothbrush, a hairbrush, a notebook, four pens, a camera, two chargers, a passport, a "
    "map of the city, a guidebook, a bottle of water, a sandwich, an apple, a chocolate bar, and, just in "
    "case, a small first aid kit with bandages, aspirin, and a tiny pair of scissors.",
    # multi-sentence texts (chunks go sentence by sentence)
    "Dr. Smith arrived. He was late. The meeting had started at 9:00 a.m. sharp.",
    "It was cold. \"Very cold,\" she said. (Nobody disagreed.) Then we left.",
    "First paragraph here.\n\nSecond paragraph, with more text. And a second sentence.\nA new line.",
    "J. R. R. Tolkien wrote it. Mr. T. was there. The U.S. is big. I agree.",
    "What? Really! Yes... I think so.",
    "He said no. she said yes.",
    # whitespace and empty
    "",
    "   ",
    "\n\n\t  \n",
    "  Leading and trailing spaces.   ",
    "Tabs\tand\tnewlines\nin the middle.",
    "a",
    "I",
    "A.",
    "...",
    "?!",
    "42",
    "Mr.",
    "Hi",
    "OK",
]

SPLIT_TEXTS = [
    "First paragraph. It has two sentences.\n\nSecond paragraph! Is it here?\nThird line without a gap.",
    "Dr. Smith met Mr. Jones. J. K. Rowling was not there. They talked about St. Paul.",
    "He said \"Stop.\" Then he left. (She stayed.) The end.",
    "Wait... what? No! e.g. this is not a new sentence. And this is.",
    "   \n\n  Indented paragraph.  \n\n\n  Another one.\n",
    "No end punctuation\nanother line\n\nthird paragraph",
    "The U.S. Army arrived. The u.s. Navy did not. Call Prof. X now.",
    "Numbers 3.5 and 4.25 are decimals. Version 2.0 shipped. Done.",
    "He whispered \u201cgoodbye.\u201d She cried. \u2018Why?\u2019 he asked.",
    "",
    "Single sentence without a break",
    "Ellipsis\u2026 Then more. (Parenthetical.) [Bracketed.] Done!",
]


def main():
    wheel = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        here, "..", "..", "crates", "workers", "g2p", "tests", "fixtures", "g2p.json")
    sys.path.insert(0, wheel)
    from hibari.g2p import G2P
    from hibari.tts import Hibari, MAX_PHONEMES, _CLAUSE

    def phonemize(g2p, text):
        """Hibari.phonemize, with `g2p` in place of the instance's lazily loaded one."""
        chunks = []
        for sent in Hibari.split_sentences(text):
            ps = g2p(sent)
            if not ps:
                continue
            if len(ps) <= MAX_PHONEMES:
                chunks.append(ps)
                continue
            cur = ""
            for part in _CLAUSE.split(ps):
                if cur and len(cur) + len(part) + 1 > MAX_PHONEMES:
                    chunks.append(cur)
                    cur = part
                else:
                    cur = f"{cur} {part}" if cur else part
            if cur:
                chunks.append(cur)
        return chunks

    us, gb = G2P(british=False), G2P(british=True)
    fixture = {
        "corpus": CORPUS,
        "us": [phonemize(us, t) for t in CORPUS],
        "gb": [phonemize(gb, t) for t in CORPUS],
        "split": [{"text": t, "sentences": Hibari.split_sentences(t)} for t in SPLIT_TEXTS],
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    long = sum(1 for chunks in fixture["us"] if len(chunks) > 1)
    print(f"{len(CORPUS)} texts ({long} with several chunks), {len(SPLIT_TEXTS)} split texts -> {out}")


if __name__ == "__main__":
    main()
